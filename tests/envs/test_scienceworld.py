"""The real ScienceWorld engine (Java 17) behind the Env interface: expert, replay, crashes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from components.config import Config, EnvConfig, ScienceWorldConfig, SplitCountsConfig
from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, NORM_SCORE, REWARD_SCORE, VALID, WON
from components.envs.episodic import META_FEEDBACK
from components.envs.scienceworld_env import ScienceWorldEnv
from components.envs.scienceworld_tasks import generate_task_suite
from components.schema import Task
from tests.envs.common import (
    assert_killed_engine_fails_the_episode,
    assert_replay_matches_live,
    collected,
    env_config,
    module_env_fixtures,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.scienceworld,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs Java 17: make system-deps"),
]

MAX_ADMISSIBLE = 25


def _config(max_steps: int = 20) -> Config:
    sw = ScienceWorldConfig(
        task_names=("find-non-living-thing",),
        variations=SplitCountsConfig(train=1, validation=1, test=1),
        max_admissible=MAX_ADMISSIBLE,
    )
    return env_config(EnvConfig(name="scienceworld", max_steps=max_steps, scienceworld=sw))


# suite: one variation per split of find-non-living-thing, gold paths verified (~10-20 s).
# env: one engine (JVM) shared by the tests of this module
suite, env = module_env_fixtures(_config, generate_task_suite, "sw")


def _train(suite: list[Task]) -> Task:
    return next(t for t in suite if t.split == "train")


def test_suite_splits_by_scienceworld_variation_lists(suite: list[Task], tmp_path: Path):
    assert sorted(t.split for t in suite) == ["test", "train", "validation"]
    assert len({t.seed for t in suite}) == 3  # a variation is never in two splits
    again = generate_task_suite(_config(), tmp_path, progress=False)
    assert [t.model_dump() for t in again] == [t.model_dump() for t in suite]  # deterministic
    for t in suite:
        assert t.env == "scienceworld" and t.family == "find-non-living-thing"
        assert t.instruction.startswith("Your task is to")
        assert t.walkthrough and t.difficulty == len(t.walkthrough)


def test_a_short_variation_list_is_used_whole(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    # power-component's test list holds 5 variations: asking for 6 takes those that win
    sw = ScienceWorldConfig(
        task_names=("power-component",),
        variations=SplitCountsConfig(train=1, validation=1, test=6),
        max_admissible=MAX_ADMISSIBLE,
    )
    cfg = env_config(EnvConfig(name="scienceworld", max_steps=20, scienceworld=sw))
    with caplog.at_level("INFO", logger="components.envs.scienceworld_tasks"):
        tasks = generate_task_suite(cfg, tmp_path, progress=False)
    test = [t for t in tasks if t.split == "test"]
    assert 1 <= len(test) <= 5 and len({t.seed for t in test}) == len(test)
    assert any("its list has 5" in r.getMessage() for r in caplog.records)


def test_expert_solves_and_reward_is_outcome_only(env: ScienceWorldEnv, suite: list[Task]):
    task = _train(suite)
    obs, info = env.reset(task)
    assert obs.startswith("Location: ") and "\nInventory: " in obs
    assert info[VALID] and not info[WON]
    rewards = []
    while True:
        action = env.expert_action()
        assert action is not None
        # the bounded admissible list always offers the expert's next action
        assert action in info[ADMISSIBLE] and len(info[ADMISSIBLE]) <= MAX_ADMISSIBLE
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    assert rewards[-1] == 1 and sum(rewards) == 1
    assert terminated and not truncated and info[WON] and info["score"] == 100
    assert info[ADMISSIBLE] == [] and env.expert_action() is None
    with pytest.raises(RuntimeError):
        env.step("look around")


def test_replay_in_a_fresh_engine_equals_live_stepping(env: ScienceWorldEnv, suite: list[Task]):
    task = _train(suite)
    env.reset(task)
    actions = [*task.walkthrough[:3], "look around", "pick up unicorn", task.walkthrough[3]]
    live = [env.step(a) for a in actions]
    other = ScienceWorldEnv(max_steps=20, max_admissible=MAX_ADMISSIBLE)
    assert_replay_matches_live(other, task, actions, live, (0, 3, len(actions) - 1))


def test_malformed_and_unknown_actions_leave_the_state(env: ScienceWorldEnv, suite: list[Task]):
    obs, _ = env.reset(_train(suite))
    location = obs.splitlines()[0]
    for bad in ("blah blah", "pick up unicorn", "go north\nlook around", "!!!"):
        obs, reward, terminated, _truncated, info = env.step(bad)
        assert not info[VALID] and reward == 0 and not terminated and not info[LOST]
        assert obs.splitlines()[0] == location
        assert "No known action" in info[FEEDBACK]
    assert env.history[0] == "blah blah"


def test_meta_commands_never_reach_the_simulator(suite: list[Task]):
    task = _train(suite)
    walkthrough = list(task.walkthrough or [])
    env = ScienceWorldEnv(max_steps=20, max_admissible=MAX_ADMISSIBLE, reward=REWARD_SCORE)
    try:
        env.reset(task)
        obs, _, _, _, info = env.step(walkthrough[0])
        for meta in ("reset task", "quit", "save", "undo"):
            after, reward, terminated, truncated, meta_info = env.step(meta)
            assert (reward, terminated, truncated) == (0, False, False), meta
            assert not meta_info[VALID] and meta_info[FEEDBACK] == META_FEEDBACK
            assert after.splitlines()[:-1] == obs.splitlines()[:-1]  # all but the Feedback
            assert meta_info[ADMISSIBLE] == info[ADMISSIBLE]
            assert meta_info[NORM_SCORE] == info[NORM_SCORE]
            assert env.expert_action() == walkthrough[1]  # the gold path did not restart
        rewards = [env.step(a)[1] for a in walkthrough[1:]]
        # reward = score: the score's gains, summing to the full score at the win
        assert sum(rewards) + info[NORM_SCORE] == pytest.approx(1.0)
    finally:
        env.close()


def test_killed_jvm_fails_the_episode_and_the_next_one_works(suite: list[Task]):
    env = ScienceWorldEnv(max_steps=20)
    try:
        assert_killed_engine_fails_the_episode(env, _train(suite), lambda: env.engine_pid)
    finally:
        env.close()


def test_collection_runs_on_scienceworld(suite: list[Task], tmp_path: Path):
    summary, trajs = collected(_config(), suite, tmp_path)
    assert summary["n_trajectories"] == 3 == len(trajs)  # train split only
    assert {t.policy for t in trajs} == {"expert", "noisy", "random"}
    expert = next(t for t in trajs if t.policy == "expert")
    assert expert.success and expert.steps[-1].reward == 1
    assert all(s.admissible_actions for s in expert.steps)
    assert all(t.env == "scienceworld" and t.split == "train" for t in trajs)
