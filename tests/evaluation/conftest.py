"""Fixtures for the evaluation tests: a 2-game real TextWorld suite, records, a fake server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components.config import Config, JudgeConfig
from components.config.small import small_config
from components.schema import Provenance, Task, Trajectory, Transition, stable_id
from tests.factories import fast_client, make_step, trajectory_of

KEY_ENV = "DREAMGYM_TEST_JUDGE_KEY"
SENTINEL_KEY = "sk-SENTINEL-judge-key-0123456789abcdef"


@dataclass(frozen=True)
class Games:
    """A generated suite: the project root its game paths are relative to, and its tasks."""

    root: Path
    tasks: list[Task]

    def by_id(self) -> dict[str, Task]:
        """task_id -> Task."""
        return {t.task_id: t for t in self.tasks}


def suite_config() -> Config:
    # two quest games of difficulty 3: 3-step walkthroughs (open, take, put / go, take, put)
    return small_config(
        [("quest", 2, 3, 3)], seed=7, split=(0.4, 0.3), splits=("train",), workers=1
    )


@pytest.fixture(scope="session")
def tw_games(tmp_path_factory: pytest.TempPathFactory) -> Games:
    """Two real TextWorld games generated once per session (~10 s)."""
    from tests.integration.textworld_suite import games_pool, generate_shared

    root = tmp_path_factory.mktemp("judge_tw")
    tasks = generate_shared(suite_config(), root, games_pool(tmp_path_factory))
    return Games(root=root, tasks=tasks)


def play(env: Any, task: Task, actions: list[str]) -> Trajectory:
    """Play ``actions`` in the REAL env and record them as a synthetic trajectory.

    A faithful "synthetic" trajectory: what a perfect experience model would predict.
    """
    state, _ = env.reset(task)
    episode_id = stable_id("judge-test", task.task_id, *actions)
    initial, steps = state, []
    for i, action in enumerate(actions):
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append(
            make_step(
                episode_id,
                i,
                state,
                action,
                obs,
                task_id=task.task_id,
                instruction=task.instruction,
                reward=reward,
                done=terminated or truncated,
                valid_action=bool(info.get("valid_action", True)),
                source="synthetic",
                provenance=Provenance(policy="agent", iteration=1, checkpoint="ckpt-1"),
            )
        )
        state = obs
        if terminated or truncated:
            break
    return trajectory_of(steps, task.split, initial_state=initial)


def with_steps(traj: Trajectory, **changes_by_step: dict[str, Any]) -> Trajectory:
    """A copy with some transitions changed: ``with_steps(t, s1={"next_state": ...})``."""
    steps = list(traj.steps)
    for key, update in changes_by_step.items():
        i = int(key.removeprefix("s"))
        steps[i] = steps[i].model_copy(update=update)
    episode_id = traj.episode_id + "-x"
    steps = [
        s.model_copy(update={"episode_id": episode_id, "id": Transition.make_id(episode_id, i)})
        for i, s in enumerate(steps)
    ]
    success = bool(steps[-1].reward)
    return traj.model_copy(update={"steps": steps, "episode_id": episode_id, "success": success})


def judge_config(**overrides: Any) -> JudgeConfig:
    """Judge settings with test-sized timeouts and backoffs."""
    small = {"concurrency": 2, "timeout_s": 2.0, "max_cost_usd": None, "max_tokens": 128}
    return fast_client(JudgeConfig, KEY_ENV, **{**small, **overrides})


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The sentinel key exported in the judge's key variable."""
    monkeypatch.setenv(KEY_ENV, SENTINEL_KEY)
    return SENTINEL_KEY
