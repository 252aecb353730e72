"""TextWorld env and task suite on real generated games."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from components.config import EnvConfig
from components.envs import env_factory, make_env
from components.envs.base import (
    ADMISSIBLE,
    FEEDBACK,
    LOST,
    VALID,
    WON,
    Env,
    EnvError,
    ReplayableEnv,
)
from components.envs.textworld_env import CHAINED_FEEDBACK, TextWorldEnv
from components.envs.textworld_tasks import (
    GAMES_DIR,
    META_SUFFIX,
    generate_task_suite,
    load_task_suite,
    plan_task_suite,
    spread_difficulties,
)
from components.schema import Task
from tests.integration.textworld_suite import Suite, games_pool, generate_shared, suite_config

pytestmark = pytest.mark.integration


# -- task suite ---------------------------------------------------------------------------------


def test_suite_is_planned_deterministically_and_split_by_game(tw_suite: Suite):
    plan = plan_task_suite(tw_suite.cfg)
    assert plan == plan_task_suite(suite_config())  # same seed, same ids/splits/seeds
    other = {s.task_id for s in plan_task_suite(suite_config(seed=8))}
    assert other.isdisjoint(s.task_id for s in plan)
    assert [(s.task_id, s.split, s.seed) for s in plan] == [
        (t.task_id, t.split, t.seed) for t in tw_suite.tasks
    ]
    assert len({t.task_id for t in tw_suite.tasks}) == 5
    for family in ("quest", "cooking", "treasure"):
        assert any(t.split == "train" for t in tw_suite.tasks if t.family == family)
    assert {t.split for t in tw_suite.tasks} == {"train", "validation", "test"}
    assert sorted(t.difficulty for t in tw_suite.tasks if t.family == "quest") == [1, 2, 3]


def test_fixtures_reuse_the_runs_pool_of_generated_games(
    tw_suite: Suite, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, caplog
):
    with caplog.at_level(logging.INFO, logger="components.envs.textworld_tasks"):
        tasks = generate_shared(tw_suite.cfg, tmp_path, games_pool(tmp_path_factory))
    assert "5 reused, 0 to generate" in caplog.text
    assert [t.model_dump() for t in tasks] == [t.model_dump() for t in tw_suite.tasks]
    assert all((tmp_path / t.game_file).is_file() for t in tasks)


def test_suite_tasks_are_portable_and_complete(tw_suite: Suite):
    assert load_task_suite(tw_suite.tasks_dir) == tw_suite.tasks
    for t in tw_suite.tasks:
        assert t.env == "textworld" and t.instruction and t.walkthrough
        assert t.game_file and not Path(t.game_file).is_absolute()
        assert (tw_suite.root / t.game_file).is_file()
        assert (tw_suite.root / t.game_file).with_suffix(".json").is_file()


def test_split_rules_with_tiny_counts():
    assert spread_difficulties(1, 2, 5) == [2]
    assert spread_difficulties(4, 1, 20) == [1, 7, 14, 20]
    cfg = suite_config()
    tiny = cfg.tasks.model_copy(
        update={"families": tuple(f.model_copy(update={"n_games": 1}) for f in cfg.tasks.families)}
    )
    plan = plan_task_suite(cfg.model_copy(update={"tasks": tiny}))
    assert [s.split for s in plan].count("test") == 1  # >=1 test game overall
    assert [s.split for s in plan].count("train") == 2


def test_generation_resumes_and_reproduces_games(tw_suite: Suite):
    games = tw_suite.tasks_dir / GAMES_DIR
    victim = tw_suite.task("quest")
    before = {p.name: p.stat().st_mtime_ns for p in games.iterdir()}
    original_json = (tw_suite.root / victim.game_file).with_suffix(".json").read_bytes()
    # an interrupted generation: the marker and the game of one task are missing
    (games / f"{victim.task_id}{META_SUFFIX}").unlink()
    (tw_suite.root / victim.game_file).unlink()
    tasks = generate_task_suite(
        tw_suite.cfg, tw_suite.tasks_dir, progress=False, root=tw_suite.root
    )
    assert tasks == tw_suite.tasks
    after = {p.name: p.stat().st_mtime_ns for p in games.iterdir()}
    changed = {n for n in after if after[n] != before.get(n)}
    assert changed and all(n.startswith(victim.task_id) for n in changed)  # others reused
    regenerated = (tw_suite.root / victim.game_file).with_suffix(".json").read_bytes()
    assert regenerated == original_json  # same seed, same game


def test_treasure_games_with_the_knowledge_base_parsed_once_are_the_same_games():
    import json

    import textworld
    import textworld.challenges

    from components.envs.textworld_games import _make_game

    make = textworld.challenges.CHALLENGES["tw-treasure_hunter"][1]
    for level, seed in ((3, 11), (12, 12), (3, 13)):  # one KB parse serves all three
        options = textworld.GameOptions()
        options.seeds = seed
        fresh = make({"level": level}, options)  # parses its own knowledge base
        shared = _make_game("treasure", level, seed)
        assert json.dumps(shared.serialize(), sort_keys=True) == json.dumps(
            fresh.serialize(), sort_keys=True
        )


# -- env -----------------------------------------------------------------------------------------


@pytest.fixture
def env(tw_suite: Suite):
    e = TextWorldEnv(max_steps=50, root=tw_suite.root)
    yield e
    e.close()


def test_make_env_gives_a_replayable_textworld_env(tw_suite: Suite):
    e = make_env(EnvConfig(name="textworld", max_steps=5), root=tw_suite.root)
    assert isinstance(e, Env) and isinstance(e, ReplayableEnv)
    assert e.name == "textworld" and e.max_steps == 5


def test_envs_of_one_factory_share_loaded_games_and_play_them_identically(tw_suite: Suite):
    make = env_factory(EnvConfig(name="textworld", max_steps=50), root=tw_suite.root)
    task, other = tw_suite.task("quest"), tw_suite.task("treasure")
    first, second = make(), make()
    pool = first._engines
    assert pool is second._engines is not None
    played = [first.reset(task)[0]] + [first.step(a)[0] for a in task.walkthrough[:2]]
    first.reset(other)  # switching games gives the first engine back to the pool
    assert pool.misses == 2 and pool.hits == 0
    # the same commands again: answered from the tree, no engine is taken
    replayed = [second.reset(task)[0]] + [second.step(a)[0] for a in task.walkthrough[:2]]
    assert replayed == played and pool.hits == 0 and pool.answered == len(played)
    second.reset(task)
    second.step("look")  # a new path: the idle engine of the game restarts and runs it
    assert pool.hits == 1
    first.close()
    second.close()
    lone = make_env(EnvConfig(name="textworld", max_steps=50), root=tw_suite.root)
    assert lone._engines is not pool and lone.reset(task)[0] == played[0]
    lone.close()


def _random_episodes(envs: list, tasks: list[Task], seed: int, n: int) -> list:
    """``n`` episodes of random commands (admissible, invalid, refused, chained) on envs
    and tasks picked at random; every observation, reward, flag and info, in order."""
    import random

    rng = random.Random(seed)
    extra = ["look", "xyzzy", "quit", "go east. take key", "inventory"]
    out: list = []
    for _ in range(n):
        env, task = rng.choice(envs), rng.choice(tasks)
        out.append(env.reset(task))
        done = False
        while not done:
            pick = rng.random()
            if env.expert and pick < 0.4:
                action = env.expert_action() or "look"
            elif pick < 0.55:
                action = rng.choice(extra)
            else:
                action = rng.choice(env.admissible_actions[:3])
            step = env.step(action)
            out.append(step)
            done = step[2] or step[3]
    return out


@pytest.mark.parametrize("expert", [False, True])
def test_answers_read_from_the_tree_equal_the_engines_answers(tw_suite: Suite, expert: bool):
    from components.envs.textworld_engines import EnginePool

    def envs(pool: EnginePool) -> list[TextWorldEnv]:
        return [
            TextWorldEnv(max_steps=8, root=tw_suite.root, expert=expert, engines=pool)
            for _ in range(2)
        ]

    tasks = tw_suite.tasks[:3]
    engines_only = EnginePool(max_answers=0)  # keeps nothing: every answer is played
    played = _random_episodes(envs(engines_only), tasks, 0, 30)
    assert engines_only.answered == 0 and engines_only.played > 0
    tree = EnginePool()
    assert _random_episodes(envs(tree), tasks, 0, 30) == played
    assert tree.played <= engines_only.played  # paths repeated within the round were read
    first_round = tree.played
    assert _random_episodes(envs(tree), tasks, 0, 30) == played
    assert tree.played == first_round  # every reset and step of the second round was read
    # the valid actions were shared per set of facts, and states recurred
    assert any(tree._valid.values())


def test_reset_gives_a_compact_abstract_state(env: TextWorldEnv, tw_suite: Suite):
    for task in tw_suite.tasks:
        obs, info = env.reset(task)
        lines = obs.split("\n")
        assert lines[0].startswith("Location: ") and lines[2].startswith("Inventory: ")
        assert lines[3].startswith("Feedback: ") and len(lines) == 4
        assert "$$" not in obs and "-=" not in obs and ">" not in obs
        assert task.instruction not in obs  # the goal is separate, not part of the state
        assert info[ADMISSIBLE] == sorted(info[ADMISSIBLE]) and info[ADMISSIBLE]
        assert info[VALID] is True and info[WON] is False and info[LOST] is False
        assert info[FEEDBACK]


def test_walkthrough_wins_with_outcome_reward(env: TextWorldEnv, tw_suite: Suite):
    for task in tw_suite.tasks:
        env.reset(task)
        assert task.walkthrough
        for i, action in enumerate(task.walkthrough):
            _, reward, terminated, truncated, info = env.step(action)
            last = i == len(task.walkthrough) - 1
            assert terminated == last and not truncated
            assert reward == int(last)
        assert info[WON] and not info[LOST] and info[ADMISSIBLE] == []
        with pytest.raises(RuntimeError):
            env.step("look")  # the episode is over


def test_invalid_action_is_flagged_and_changes_nothing(env: TextWorldEnv, tw_suite: Suite):
    task = tw_suite.task("quest")
    obs, info = env.reset(task)
    location = obs.split("\n")[0]
    nxt, reward, terminated, truncated, info2 = env.step("take unicorn")
    assert info2[VALID] is False and reward == 0 and not terminated and not truncated
    assert nxt.split("\n")[:3] == obs.split("\n")[:3] and nxt.split("\n")[0] == location
    assert "can't" in info2[FEEDBACK].lower()
    assert info2[ADMISSIBLE] == info[ADMISSIBLE]
    _, _, _, _, info3 = env.step(info2[ADMISSIBLE][0])
    assert info3[VALID] is True


def test_chained_commands_are_refused_as_one_invalid_step(env: TextWorldEnv, tw_suite: Suite):
    task = tw_suite.task("quest")
    obs, _ = env.reset(task)
    first = task.walkthrough[0]
    nxt, reward, _, _, info2 = env.step(f"{first}. {first}")
    assert info2[VALID] is False and reward == 0
    assert info2[FEEDBACK] == CHAINED_FEEDBACK
    assert nxt.split("\n")[:3] == obs.split("\n")[:3]
    assert env.history == [f"{first}. {first}"]  # it still costs a step


def test_expert_replans_after_detours(env: TextWorldEnv, tw_suite: Suite):
    for task in tw_suite.tasks:
        env.reset(task)
        env.step("take unicorn")
        env.step("look")
        done, reward = False, 0
        while not done:
            action = env.expert_action()
            assert action is not None
            _, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        assert reward == 1 and env.expert_action() is None


def test_truncation_at_max_steps(tw_suite: Suite):
    env = TextWorldEnv(max_steps=2, root=tw_suite.root)
    env.reset(tw_suite.task("cooking"))
    assert env.step("look")[3] is False
    _, reward, terminated, truncated, _ = env.step("look")
    assert truncated and not terminated and reward == 0
    with pytest.raises(RuntimeError):
        env.step("look")
    env.close()


def test_replay_equals_live_stepping(env: TextWorldEnv, tw_suite: Suite):
    task = tw_suite.task("cooking")
    actions = ["take unicorn", "look", *task.walkthrough]
    env.reset(task)
    live = [env.step(a) for a in actions]
    replayer = TextWorldEnv(max_steps=50, root=tw_suite.root)
    # out of order (full resets) and then in order (prefix fast path)
    for order in (reversed(range(len(actions))), range(len(actions))):
        for i in order:
            r = replayer.replay(task, actions[:i], actions[i])
            assert (r.observation, r.reward, r.terminated, r.truncated, r.info) == live[i]
    assert r.reward == 1 and r.done
    with pytest.raises(ValueError):
        replayer.replay(task, actions, "look")  # the prefix already ends the episode
    replayer.close()


def test_replay_reports_truncation_like_live_stepping(tw_suite: Suite):
    env = TextWorldEnv(max_steps=2, root=tw_suite.root)
    task = tw_suite.task("quest")
    assert env.replay(task, [], "look").truncated is False
    assert env.replay(task, ["look"], "look").truncated is True
    env.close()


def test_env_errors_are_raised_and_recoverable(env: TextWorldEnv, tw_suite: Suite, tmp_path):
    task = tw_suite.task("treasure")
    broken = task.model_copy(update={"game_file": str(tmp_path / "missing.z8")})
    with pytest.raises(EnvError):
        env.reset(broken)
    env.reset(task)

    def crash(command: str):
        raise OSError("interpreter died")

    env._tw.step = crash  # simulate the engine dying mid-episode
    with pytest.raises(EnvError):
        env.step("look")
    obs, info = env.reset(task)  # a fresh engine
    assert obs and info[ADMISSIBLE]


def test_relative_game_files_resolve_against_root(tw_suite: Suite, monkeypatch):
    task: Task = tw_suite.task("quest")
    monkeypatch.chdir(tw_suite.root)
    env = TextWorldEnv(max_steps=5)  # root defaults to cwd
    env.reset(task)
    env.close()
    monkeypatch.chdir(os.sep)
    with pytest.raises(EnvError):
        TextWorldEnv(max_steps=5).reset(task)
