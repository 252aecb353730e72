"""What the real-env test modules share: configs, collection, replay and crash checks."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from components.config import Config, EnvConfig
from components.config.small import small_config
from components.data.collect import collect
from components.envs import make_env
from components.envs.base import EnvError
from components.schema import Task, Trajectory, read_jsonl
from tests.fakes.agentgym_server import serve


def env_config(
    env: EnvConfig,
    episodes: dict[str, int] | None = None,
    p_invalid: float = 0.3,
) -> Config:
    """A ci Config around ``env``: train-split collection, one process, the given mix."""
    return small_config(
        [("quest", 2, 1, 3)],
        env=env,
        episodes=episodes or {"expert": 1, "noisy": 1, "random": 1},
        p_invalid=p_invalid,
        splits=("train",),
        workers=1,
    )


def module_env_fixtures(
    config: Callable[[], Config], generate: Callable[..., list[Task]], folder: str
) -> tuple[Any, Any]:
    """A real env's test-module fixtures: ``suite`` (``generate``'s task suite of
    ``config()``, written to a fresh ``folder``) and ``env`` (one env shared by the module's
    tests, closed afterwards); a module binds both names:
    ``suite, env = module_env_fixtures(...)``."""

    @pytest.fixture(scope="module")
    def suite(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
        return generate(config(), tmp_path_factory.mktemp(folder), progress=False)

    @pytest.fixture(scope="module")
    def env() -> Iterator[Any]:
        e = make_env(config().env)
        yield e
        e.close()

    return suite, env


def collected(
    cfg: Config, tasks: Sequence[Task], out: Path
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Run collection into ``out``; (summary, every trajectory written)."""
    summary = collect(cfg, list(tasks), out, out, progress=False)
    return summary, [t for p in sorted(out.glob("*.jsonl")) for t in read_jsonl(p, Trajectory)]


def assert_replay_matches_live(
    fresh: Any, task: Task, actions: Sequence[str], live: Sequence[tuple], indices: Sequence[int]
) -> None:
    """``fresh.replay`` of each prefix gives what live stepping gave (a new engine)."""
    from components.envs.base import ADMISSIBLE

    try:
        for i in indices:
            got = fresh.replay(task, list(actions[:i]), actions[i])
            obs, reward, terminated, truncated, info = live[i]
            assert got.observation == obs
            assert (got.reward, got.terminated, got.truncated) == (reward, terminated, truncated)
            assert got.info[ADMISSIBLE] == info[ADMISSIBLE]
    finally:
        fresh.close()


def assert_killed_engine_fails_the_episode(
    env: Any, task: Task, pid_of: Callable[[], int | None]
) -> None:
    """Kill -9 the engine mid-episode: EnvError, the dead engine dropped, then a fresh
    engine plays the walkthrough to a win."""
    walkthrough = list(task.walkthrough or [])
    env.reset(task)
    env.step(walkthrough[0])
    pid = pid_of()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EnvError):
        env.step(walkthrough[1])
    assert pid_of() is None  # the dead engine was dropped
    env.reset(task)  # a fresh engine
    assert pid_of() not in (None, pid)
    reward, terminated = 0, False
    for action in walkthrough:
        _, reward, terminated, _, _ = env.step(action)
    assert reward == 1 and terminated


@contextmanager
def served_env(kind: str, env_cls: type, **kwargs: Any) -> Iterator[tuple[Any, Any]]:
    """A fake AgentGym server of ``kind`` and an adapter env on it (closed afterwards)."""
    with serve(kind) as server:
        env = env_cls(server.url, **kwargs)
        try:
            yield server, env
        finally:
            env.close()
