"""MiniWoB++ in real headless Chromium behind the Env interface: experts, replay, crashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import Config, EnvConfig, MiniWoBConfig, SplitCountsConfig
from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON
from components.envs.miniwob_dom import quoted
from components.envs.miniwob_env import (
    DEFAULT_CHROME,
    DEFAULT_CHROMEDRIVER,
    MiniWoBEnv,
    ParsedAction,
    parse_action,
)
from components.envs.miniwob_tasks import SEED_RANGE, generate_task_suite
from components.experience.grounded_page import page_edit
from components.schema import Task
from tests.envs.common import (
    assert_killed_engine_fails_the_episode,
    assert_replay_matches_live,
    collected,
    env_config,
    module_env_fixtures,
)

HAVE_BROWSER = Path(DEFAULT_CHROME).exists() and Path(DEFAULT_CHROMEDRIVER).exists()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.miniwob,
    pytest.mark.skipif(
        not HAVE_BROWSER, reason="needs chromium + chromium-driver: make system-deps"
    ),
]
TASKS = ("enter-text", "login-user", "click-checkboxes", "navigate-tree", "search-engine")


def _config(tasks: tuple[str, ...] = TASKS) -> Config:
    mw = MiniWoBConfig(task_names=tasks, seeds=SplitCountsConfig(train=1, validation=1, test=1))
    return env_config(EnvConfig(name="miniwob", max_steps=10, miniwob=mw))


# suite: one seed per split of each task, instructions read from the real pages.
# env: one browser shared by the tests of this module
suite, env = module_env_fixtures(_config, generate_task_suite, "mw")


def _task(suite: list[Task], family: str, split: str = "train") -> Task:
    return next(t for t in suite if t.family == family and t.split == split)


def _body(obs: str) -> str:
    return obs.rsplit("\nFeedback: ", 1)[0]


def test_actions_parse_strictly():
    assert parse_action("click [12]") == ParsedAction("click", 12)
    assert parse_action(' type [3] "hello world" ') == ParsedAction("type", 3, "hello world")
    assert parse_action('select [4] "Heard Island"') == ParsedAction("select", 4, "Heard Island")
    assert parse_action("press [5] Enter") == ParsedAction("press", 5, "Enter")
    for bad in ("click 12", "click [x]", "type [3] hello", "tap [3]", "", 'type [3] "a\nb"'):
        assert parse_action(bad) is None


def test_suite_is_deterministic_and_splits_by_seed_range(suite: list[Task], tmp_path: Path):
    assert {t.family for t in suite} == set(TASKS)
    for t in suite:
        k = ("train", "validation", "test").index(t.split)
        assert k * SEED_RANGE <= t.seed < (k + 1) * SEED_RANGE
        assert t.walkthrough and t.difficulty == len(t.walkthrough)  # every expert wins
    login = _task(suite, "login-user")
    assert login.instruction.startswith("Enter the username")
    again = generate_task_suite(_config(("login-user",)), tmp_path, progress=False)
    assert [t.model_dump() for t in again] == [
        t.model_dump() for t in suite if t.family == "login-user"
    ]


@pytest.mark.parametrize("family", TASKS)
def test_expert_wins_with_outcome_reward(env: MiniWoBEnv, suite: list[Task], family: str):
    task = _task(suite, family, "test")
    obs, info = env.reset(task)
    assert 2 <= len(_body(obs).splitlines()) <= 20 and info[VALID]
    assert all(line.startswith("[") for line in _body(obs).splitlines())
    rewards = []
    for _ in range(10):
        action = env.expert_action()
        assert action is not None and action in info[ADMISSIBLE]
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    assert rewards[-1] == 1 and sum(rewards) == 1 and terminated and info[WON]
    assert info[ADMISSIBLE] == [] and env.expert_action() is None


def test_replay_in_a_fresh_browser_equals_live_stepping(env: MiniWoBEnv, suite: list[Task]):
    task = _task(suite, "search-engine")
    env.reset(task)
    actions = [task.walkthrough[0], "click [999]", *task.walkthrough[1:]]
    live = [env.step(a) for a in actions]
    # same elements, same ids, same values in a fresh browser
    assert_replay_matches_live(
        MiniWoBEnv(max_steps=10), task, actions, live, (0, 2, len(actions) - 1)
    )


def test_malformed_and_misdirected_actions_change_nothing(env: MiniWoBEnv, suite: list[Task]):
    obs, _ = env.reset(_task(suite, "login-user"))
    before = _body(obs)
    button = next(e for e in env.elements if e.kind == "button")
    field = next(e for e in env.elements if e.kind == "textbox")
    for bad in (
        "click 5",
        "click [999]",
        f'type [{button.ref}] "x"',
        f'select [{field.ref}] "x"',
        f"press [{field.ref}] F13",
        "login please",
    ):
        obs, reward, terminated, _truncated, info = env.step(bad)
        assert not info[VALID] and reward == 0 and not terminated and not info[LOST]
        assert _body(obs) == before
        assert info[FEEDBACK].startswith("Invalid action")


def test_links_styled_as_text_are_listed_and_text_nodes_cannot_be_clicked(
    env: MiniWoBEnv, tmp_path: Path
):
    # click-link's paragraph mixes links with runs of text: MiniWoB's text nodes
    task = generate_task_suite(_config(("click-link",)), tmp_path, progress=False)[0]
    obs, info = env.reset(task)
    links = [e for e in env.elements if e.kind == "link"]  # <span class="alink">
    assert links and all(f"click [{e.ref}]" in info[ADMISSIBLE] for e in links)
    node = next(e for e in env.elements if e.ref < 0)
    assert not any(f"[{node.ref}]" in a for a in info[ADMISSIBLE])
    for bad in (f"click [{node.ref}]", f"press [{node.ref}] Enter"):
        after, reward, terminated, _truncated, info = env.step(bad)
        assert not info[VALID] and reward == 0 and not terminated
        assert info[FEEDBACK] == f"Invalid action: [{node.ref}] text cannot be clicked."
        assert _body(after) == _body(obs)  # the same page, its text nodes the same ids
        assert page_edit(obs, bad)[3] is False  # the dream's page model agrees


def test_a_dialog_outside_the_task_area_is_played(env: MiniWoBEnv, tmp_path: Path):
    # click-dialog-2's jQuery UI dialog sits outside #area: it offered no command before
    tasks = generate_task_suite(_config(("click-dialog-2",)), tmp_path, progress=False)
    for task in tasks[:3]:
        _obs, info = env.reset(task)
        buttons = {e.text: e.ref for e in env.elements if e.kind == "button"}
        assert set(buttons) == {"Close", "Cancel", "OK"}
        assert {f"click [{r}]" for r in buttons.values()} <= set(info[ADMISSIBLE])
        label = quoted(env.utterance)[0]  # "OK", "Cancel" or "x" (the close button)
        _obs, reward, terminated, _truncated, info = env.step(
            f"click [{buttons['Close' if label == 'x' else label]}]"
        )
        assert terminated and reward == 1 and info[VALID]


def test_an_inbox_is_played_by_opening_the_named_email(env: MiniWoBEnv, tmp_path: Path):
    # email-inbox-important: "Find the email by <sender> and click the star icon ..."
    tasks = generate_task_suite(_config(("email-inbox-important",)), tmp_path, progress=False)
    for task in tasks[:2]:
        _obs, info = env.reset(task)
        sender = env.utterance.split(" by ")[1].split()[0]
        rows = {e.text.split(":")[0]: e.ref for e in env.elements if e.kind == "email"}
        assert sender in rows and f"click [{rows[sender]}]" in info[ADMISSIBLE]
        _obs, reward, terminated, _truncated, info = env.step(f"click [{rows[sender]}]")
        assert not terminated and info[VALID]
        star = next(e.ref for e in env.elements if (e.kind, e.text) == ("icon", "star"))
        assert f"click [{star}]" in info[ADMISSIBLE]
        _obs, reward, terminated, _truncated, info = env.step(f"click [{star}]")
        assert terminated and reward == 1


def test_coverage_survey_plays_a_page_no_expert_knows(env: MiniWoBEnv):
    import random

    from bench.miniwob_coverage import play_task, task_names

    assert {"click-link", "drag-box", *TASKS} <= set(task_names())
    row = play_task(env, "click-link", 2, random.Random(0))
    assert not row["expert"] and row["episodes"] == 2 and row["admissible"] > 0
    assert row["text_nodes"] > 0 and row["invalid"] == 0  # offered commands are all valid


def test_typing_replaces_a_fields_value_and_typing_nothing_empties_it(
    env: MiniWoBEnv, suite: list[Task]
):
    env.reset(_task(suite, "login-user"))
    field = next(e for e in env.elements if e.kind == "textbox")

    def value() -> str:
        return next(e for e in env.elements if e.ref == field.ref).render()

    for text in ("hello", "xy", ""):  # the dream's page model (grounded_page) does the same
        _, _, _, _, info = env.step(f'type [{field.ref}] "{text}"')
        assert info[VALID] and value().endswith(f'"{text}"'), value()


def test_killed_chromedriver_fails_the_episode_and_the_next_one_works(suite: list[Task]):
    task = _task(suite, "login-user")
    env = MiniWoBEnv(max_steps=10)
    try:
        assert_killed_engine_fails_the_episode(env, task, lambda: env.driver_pid)
        profile = env.profile_dir  # the fresh browser's
        assert profile is not None
    finally:
        env.close()
    # nothing of this env's browser is left running, its profile dir is gone
    leftovers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if profile.encode() in cmd:
                leftovers.append(proc.name)
    assert not leftovers and not Path(profile).exists()


def test_collection_runs_on_miniwob(suite: list[Task], tmp_path: Path):
    cfg = _config(("enter-text", "click-checkboxes"))
    tasks = [t for t in suite if t.family in cfg.env.miniwob.task_names]
    summary, trajs = collected(cfg, tasks, tmp_path)
    assert summary["n_trajectories"] == 6 == len(trajs)  # 2 train tasks x 3 policies
    experts = [t for t in trajs if t.policy == "expert"]
    assert all(t.success for t in experts)
    assert all(t.env == "miniwob" and t.split == "train" for t in trajs)
    assert all(s.admissible_actions for t in experts for s in t.steps)
