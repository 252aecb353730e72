"""Contract tests of the WebShop / ALFWorld / WebArena adapters against a fake AgentGym
server over real HTTP on 127.0.0.1: episodes, replay, retries on I/O only."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import AgentGymConfig, Config, EnvConfig
from components.envs import generate_task_suite, make_env
from components.envs.agentgym_http import (
    AlfWorldHttpEnv,
    BrowserGymWebArenaEnv,
    WebArenaHttpEnv,
    WebShopHttpEnv,
)
from components.envs.base import ADMISSIBLE, LOST, VALID, WON, EnvError
from components.schema import Task
from tests.envs.common import collected, env_config, served_env
from tests.factories import make_task
from tests.fakes.agentgym_server import serve

pytestmark = pytest.mark.integration

# a healthy request never times out on a loaded host (0.5 s did: /create is not retried);
# the timeout tests use SHORT against a delay three times as long
FAST = {"timeout_s": 5.0, "max_retries": 2, "backoff_s": 0.01}
SHORT = {**FAST, "timeout_s": 1.0}
DELAY_S = 3.0


def _task(env: str, index: int = 1) -> Task:
    return make_task(f"{env}-{index}", "x", index, env=env, family=env, difficulty=0)


def _config(name: str, url: str | None = None, splits=None) -> Config:
    ag = AgentGymConfig(
        base_url=url,
        url_env="DREAMGYM_TEST_AGENTGYM_URL",
        splits=splits or {"train": (0, 2), "validation": (2, 3), "test": (3, 4)},
        **FAST,
    )
    return env_config(
        EnvConfig(name=name, max_steps=8, agentgym=ag),
        episodes={"expert": 1, "random": 1},
        p_invalid=0.2,
    )


WEBSHOP_WIN = ["search[red mug]", "click[b0001]", "click[blue]", "click[buy now]"]
ALFWORLD_WIN = [
    "go to table 1",
    "take apple 1 from table 1",
    "go to cabinet 1",
    "put apple 1 in/on cabinet 1",
]


def test_webshop_episode_through_the_protocol():
    with served_env("webshop", WebShopHttpEnv, max_steps=8, **FAST) as (_, env):
        obs, info = env.reset(_task("webshop", 1))  # session 1 wants a blue mug
        assert "Find me a blue mug" in obs and obs.splitlines()[0] == "WebShop"
        assert env.instruction().startswith("Find me a blue mug")
        assert any(a.startswith("search[") for a in info[ADMISSIBLE])
        rewards = []
        for action in WEBSHOP_WIN:
            obs, reward, terminated, _truncated, info = env.step(action)
            assert info[VALID]
            rewards.append(reward)
        assert rewards == [0, 0, 0, 1] and terminated and info[WON]
        # partial credit (wrong color) is not a success
        env.reset(_task("webshop", 1))
        for action in ["search[mug]", "click[b0001]", "click[red]", "click[buy now]"]:
            _, reward, terminated, _, info = env.step(action)
        assert reward == 0 and terminated and info[LOST] and info["server_reward"] == 0.5
        # an unknown clickable is invalid (the server performs nothing)
        env.reset(_task("webshop", 1))
        _, _, _, _, info = env.step("click[nothing here]")
        assert not info[VALID]


def test_alfworld_episode_and_replay():
    with served_env("alfworld", AlfWorldHttpEnv, max_steps=8, **FAST) as (_, env):
        _obs, info = env.reset(_task("alfworld", 1))
        assert env.instruction() == "put a apple in cabinet 1."
        assert "go to table 1" in info[ADMISSIBLE]
        live = [env.step(a) for a in ALFWORLD_WIN]
        assert [r[1] for r in live] == [0, 0, 0, 1] and live[-1][2]
        got = env.replay(_task("alfworld", 1), ALFWORLD_WIN[:2], ALFWORLD_WIN[2])
        assert got.observation == live[2][0] and got.info[ADMISSIBLE] == live[2][4][ADMISSIBLE]
        _, _, _, _, info = env.step("fly to the moon")
        assert not info[VALID]
        with pytest.raises(ValueError, match="before step 4"):  # the judge relies on it
            env.replay(_task("alfworld", 1), ALFWORLD_WIN, "look")


def test_webarena_wraps_actions_for_the_server_and_rewards_the_answer():
    with served_env("webarena", WebArenaHttpEnv, max_steps=8, **FAST) as (_, env):
        obs, info = env.reset(_task("webarena", 2))
        assert env.instruction() == "How many orders were placed today?"
        assert info[ADMISSIBLE] is None  # open action space
        obs, reward, terminated, _, info = env.step("click [7]")
        assert info[VALID] and "PREVIOUS ACTION: click [7]" in obs and not terminated
        _, _, _, _, info = env.step("dance [7]")
        assert not info[VALID]
        _, reward, terminated, _, info = env.step("stop [42]")
        assert reward == 1 and terminated and info[WON]


def test_a_truncation_by_the_server_is_no_loss(monkeypatch: pytest.MonkeyPatch):
    from tests.fakes.agentgym_server import WebArenaWorld

    monkeypatch.setattr(WebArenaWorld, "cut_after", 2)
    with served_env("webarena", WebArenaHttpEnv, max_steps=8, **FAST) as (_, env):
        env.reset(_task("webarena", 2))
        assert env.step("click [7]")[2:4] == (False, False)
        _, reward, terminated, truncated, info = env.step("click [7]")
        assert (reward, terminated, truncated) == (0, False, True)
        assert not info[WON] and not info[LOST]


def test_an_env_is_reset_again_after_close_a_failed_step_or_a_server_restart():
    with served_env("alfworld", AlfWorldHttpEnv, max_steps=8, **FAST) as (server, env):
        env.reset(_task("alfworld"))
        env.close()  # collection and evaluation close an env after a failure, then reuse it
        env.reset(_task("alfworld"))
        server.inject("/step", status=500)
        with pytest.raises(EnvError):
            env.step("go to table 1")
        with pytest.raises(RuntimeError):  # the remote state is unknown: no step before reset
            env.step("go to table 1")
        server.worlds.clear()  # the server restarted: it knows no remote env
        obs, _ = env.reset(_task("alfworld"))
        assert "Your task is to" in obs and server.requests["POST /create"] == 3
        server.inject("/reset", status=400)
        env.reset(_task("alfworld", 2))  # fails, then again on a fresh remote env
        _, _, _, _, info = env.step("go to table 1")
        assert info[VALID] and env.history == ["go to table 1"]


def test_idempotent_requests_are_retried_on_500_and_timeouts():
    with served_env("alfworld", AlfWorldHttpEnv, max_steps=8, **SHORT) as (server, env):
        env.reset(_task("alfworld"))
        server.inject("/reset", status=500)
        env.reset(_task("alfworld"))
        assert server.requests["POST /reset"] == 3  # first reset, 500, retry
        server.inject("/reset", delay=DELAY_S)  # longer than the 1 s client timeout
        obs, _ = env.reset(_task("alfworld"))
        assert "Your task is to" in obs


def test_steps_are_never_retried_when_they_may_have_applied():
    with served_env("alfworld", AlfWorldHttpEnv, max_steps=8, **SHORT) as (server, env):
        env.reset(_task("alfworld"))
        server.inject("/step", status=500)
        with pytest.raises(EnvError, match="HTTP 500"):
            env.step("go to table 1")
        assert server.requests["POST /step"] == 1 and server.applied_steps == 0
        env.reset(_task("alfworld"))
        server.inject("/step", delay=DELAY_S)  # applied by the server, answer too late
        with pytest.raises(EnvError, match="not retried"):
            env.step("go to table 1")
        assert server.requests["POST /step"] == 2 and server.applied_steps == 1
        # 503 means "not processed": safe to retry, applied exactly once
        env.reset(_task("alfworld"))
        server.inject("/step", status=503)
        _, _, _, _, info = env.step("go to table 1")
        assert info[VALID] and server.applied_steps == 2


def test_application_errors_fail_at_once_and_dead_servers_after_retries():
    with served_env("alfworld", AlfWorldHttpEnv, max_steps=8, **FAST) as (server, env):
        with pytest.raises(EnvError, match="out of range"):
            env.reset(_task("alfworld", 5000))
        assert server.requests["POST /reset"] == 1  # {"error"} is not retried
        url = server.url
    dead = AlfWorldHttpEnv(url, max_steps=8, **FAST)  # the server is gone: refused
    with pytest.raises(EnvError, match="failed after 3 tries"):
        dead.reset(_task("alfworld"))
    dead.close()


def test_make_env_reads_the_url_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(EnvError, match="DREAMGYM_TEST_AGENTGYM_URL"):
        make_env(_config("webshop").env)
    with serve("webshop") as server:
        monkeypatch.setenv("DREAMGYM_TEST_AGENTGYM_URL", server.url)
        env = make_env(_config("webshop").env)
        try:
            assert isinstance(env, WebShopHttpEnv)
            obs, _ = env.reset(_task("webshop", 0))
            assert "red mug" in obs
        finally:
            env.close()


def test_task_suite_and_collection_through_the_adapter(tmp_path: Path):
    with serve("alfworld") as server:
        cfg = _config("alfworld", url=server.url)
        tasks = generate_task_suite(cfg, tmp_path / "tasks", root=tmp_path)
        assert [(t.split, t.seed) for t in tasks] == [
            ("train", 0),
            ("train", 1),
            ("validation", 2),
            ("test", 3),
        ]
        assert tasks[1].instruction == "put a apple in cabinet 1."
        assert (tmp_path / "tasks" / "tasks.jsonl").exists()
        summary, trajs = collected(cfg, tasks, tmp_path / "raw")
        assert summary["n_trajectories"] == 4 == len(trajs)  # 2 train items x (expert, random)
        assert all(t.env == "alfworld" and t.steps for t in trajs)
        assert all(s.admissible_actions for t in trajs for s in t.steps)


def test_browsergym_path_needs_browsergym():
    try:
        import browsergym  # noqa: F401
    except ImportError:
        with pytest.raises(EnvError, match="BrowserGym is not installed"):
            BrowserGymWebArenaEnv(max_steps=5)
    else:  # pragma: no cover - not installed here
        pytest.skip("browsergym installed: covered by its own runs")
