"""Games made outside the project (``tw-make`` settings the generator never uses) in the
TextWorld env: walkthrough wins, the ``score`` reward option, refused meta-commands and a
game without a goal."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from components.config import EnvConfig
from components.envs import make_env
from components.envs.base import (
    ADMISSIBLE,
    FEEDBACK,
    NORM_SCORE,
    REWARD_SCORE,
    REWARD_WON,
    VALID,
    WON,
)
from components.envs.episodic import (
    LOCATION,
    META_FEEDBACK,
    META_PHRASES,
    META_VERBS,
    is_meta_command,
)
from components.envs.textworld_env import TextWorldEnv
from components.schema import Task, Transition
from tests.factories import make_task

pytestmark = pytest.mark.integration

TW_MAKE = Path(sys.executable).with_name("tw-make")
# name -> tw-make arguments: none of these is a setting of textworld_tasks._make_game
# (quest: 1 + (d + 1) // 2 rooms, 2 + 2d objects, quest length d; treasure; cooking)
TW_MAKE_GAMES = {
    "custom": ["custom", "--world-size", "3", "--nb-objects", "5", "--quest-length", "2"],
    "dense": ["tw-simple", "--rewards", "dense", "--goal", "detailed"],
    "hidden_goal": ["tw-simple", "--rewards", "balanced", "--goal", "none"],
}
SANDBOX = "sandbox"  # built with TextWorld's GameMaker: two rooms, an apple, no quest at all
SANDBOX_WALK = ["take apple", "go east", "drop apple", "go west"]
# every meta-command, a few spellings, and TextWorld's own debug commands
META_INPUTS = sorted(
    {*META_VERBS, *META_PHRASES, "QUIT", "quit.", "save,", "save game", "restore game"}
    | {"reset task", "script off", "undo.", "tw-extra-infos score", "tw-trace-actions"}
)


@dataclass(frozen=True)
class Game:
    """A compiled game and the task pointing at it."""

    task: Task
    walkthrough: list[str]
    max_score: int


def _sandbox(path: Path) -> None:
    from textworld import GameMaker

    maker = GameMaker()
    attic, cellar = maker.new_room("Attic"), maker.new_room("Cellar")
    maker.connect(attic.east, cellar.west)
    maker.set_player(attic)
    attic.add(maker.new(type="o", name="apple"))
    maker.compile(str(path))


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Game]:
    """The three tw-make games (built in parallel) and the goal-less sandbox (~10 s CPU)."""
    import textworld

    root = tmp_path_factory.mktemp("external_games")
    procs = {
        name: subprocess.Popen(
            [str(TW_MAKE), *args, "--seed", "7", "--output", str(root / f"{name}.z8"), "--silent"],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for name, args in TW_MAKE_GAMES.items()
    }
    _sandbox(root / f"{SANDBOX}.z8")
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"tw-make {name}: {out.decode(errors='replace')}"
    out: dict[str, Game] = {}
    for name in [*TW_MAKE_GAMES, SANDBOX]:
        game = textworld.Game.load(str(root / f"{name}.json"))
        walkthrough = list(game.metadata.get("walkthrough") or SANDBOX_WALK)
        game_file = str(root / f"{name}.z8")
        task = make_task(
            f"external-{name}",
            game.objective or "",
            family="external",
            split="test",
            game_file=game_file,
        )
        out[name] = Game(task, walkthrough, int(game.max_score))
    return out


def _state(obs: str, info: dict[str, Any]) -> tuple[Any, ...]:
    """What a step must leave unchanged: the state without its Feedback line, the
    admissible commands, the score and the room."""
    lines = [ln for ln in obs.splitlines() if not ln.startswith("Feedback:")]
    return tuple(lines), tuple(info[ADMISSIBLE]), info[NORM_SCORE], info[LOCATION]


def _files(*folders: Path) -> set[Path]:
    return {p for folder in folders for p in folder.rglob("*")}


# -- loading and winning --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TW_MAKE_GAMES))
def test_walkthrough_wins_each_external_game(games: dict[str, Game], name: str):
    game = games[name]
    env = TextWorldEnv(max_steps=50)  # the default: reward = won
    try:
        _, info = env.reset(game.task)
        assert not info[WON] and info[NORM_SCORE] == 0.0
        rewards = []
        for action in game.walkthrough:
            assert action in env.admissible_actions
            _, reward, terminated, truncated, info = env.step(action)
            rewards.append(reward)
        assert rewards == [0] * (len(rewards) - 1) + [1]
        assert terminated and not truncated and info[WON] and info[NORM_SCORE] == 1.0
    finally:
        env.close()
    if name == "hidden_goal":  # --goal none: nothing to show, the game still has its quest
        assert game.task.instruction == ""


def test_score_reward_pays_the_dense_games_partial_credit(games: dict[str, Game]):
    game = games["dense"]
    assert game.max_score > 2  # a point for most steps, not one at the end
    runs = {}
    for mode in (REWARD_WON, REWARD_SCORE):
        env = make_env(EnvConfig(max_steps=50, reward=mode))
        try:
            env.reset(game.task)
            runs[mode] = [env.step(a) for a in game.walkthrough]
        finally:
            env.close()
    won = [r for _, r, *_ in runs[REWARD_WON]]
    score = [r for _, r, *_ in runs[REWARD_SCORE]]
    assert won == [0] * (len(won) - 1) + [1]  # nothing until the game is won
    partial = [r for r in score[:-1] if r > 0]
    assert len(partial) >= 3 and all(0 < r < 1 for r in partial)
    assert sum(score) == pytest.approx(1.0) and min(score) >= 0
    # both are logged whatever the option: the won flag and the normalised score
    for (obs_w, _, _, _, info_w), (obs_s, _, _, _, info_s) in zip(
        runs[REWARD_WON], runs[REWARD_SCORE], strict=True
    ):
        assert obs_w == obs_s and info_w[WON] == info_s[WON]
        assert info_w[NORM_SCORE] == info_s[NORM_SCORE]
    steps = [s[4][NORM_SCORE] for s in runs[REWARD_SCORE]]
    assert steps == sorted(steps) and steps[-1] == 1.0 and runs[REWARD_SCORE][-1][4][WON]


def test_score_reward_needs_an_env_with_a_score():
    assert EnvConfig(name="scienceworld", reward="score").reward == REWARD_SCORE
    with pytest.raises(ValidationError, match="keeps a score"):
        EnvConfig(name="miniwob", reward="score")
    with pytest.raises(ValidationError):
        EnvConfig(reward="points")
    assert EnvConfig().reward == REWARD_WON  # the default profile's behaviour


# -- meta-commands ------------------------------------------------------------------------------


def test_meta_commands_are_refused_and_change_nothing(
    games: dict[str, Game], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    game = games["dense"]
    game_dir = Path(game.task.game_file or "").parent
    files_before = _files(tmp_path, game_dir)
    env = TextWorldEnv(max_steps=len(META_INPUTS) + 50, state_format="description")
    control = TextWorldEnv(max_steps=50, state_format="description")
    try:
        obs, info = env.reset(game.task)
        control.reset(game.task)
        for action in game.walkthrough[:3]:  # mid-game: a key in hand, points scored
            obs, _, _, _, info = env.step(action)
            control.step(action)
        before = _state(obs, info)
        assert before[2] > 0
        for meta in META_INPUTS:
            obs, reward, terminated, truncated, info = env.step(meta)
            assert (reward, terminated, truncated) == (0, False, False), meta
            assert not info[VALID] and not info[WON] and info[FEEDBACK] == META_FEEDBACK, meta
            assert _state(obs, info) == before, meta
        # the engine never saw them: the rest of the game plays exactly as without them
        for action in game.walkthrough[3:]:
            got, want = env.step(action), control.step(action)
            assert got[:4] == want[:4] and _state(got[0], got[4]) == _state(want[0], want[4])
        assert got[4][WON]
    finally:
        env.close()
        control.close()
    assert _files(tmp_path, game_dir) == files_before  # save / script wrote nothing


def test_refused_commands_replay_like_live_stepping(games: dict[str, Game]):
    game = games["custom"]
    actions = [game.walkthrough[0], "restart", "save", *game.walkthrough[1:]]
    env, fresh = TextWorldEnv(max_steps=30), TextWorldEnv(max_steps=30)
    try:
        env.reset(game.task)
        live = [env.step(a) for a in actions]
        assert live[-1][1] == 1
        for i in (1, 2, len(actions) - 1):
            got = fresh.replay(game.task, actions[:i], actions[i])
            assert (got.observation, got.reward, got.terminated) == live[i][:3]
    finally:
        env.close()
        fresh.close()


def test_meta_command_recognition():
    assert is_meta_command("quit") and is_meta_command("  Save  ") and is_meta_command("q")
    assert is_meta_command("!restore") and is_meta_command("reset task")
    assert is_meta_command("tw-extra-infos score") and is_meta_command("script off")
    for action in ("take brief case", "quitting", "go east", "score", "inventory", "", "?!"):
        assert not is_meta_command(action), action
    # a game that lists the command as one of its own actions keeps it
    assert not is_meta_command("save", admissible=["save", "go east"])


# -- a game without a goal -----------------------------------------------------------------------


def test_goal_less_game_loads_and_plays(games: dict[str, Game]):
    game = games[SANDBOX]
    assert game.task.instruction == "" and game.max_score == 0
    for mode in (REWARD_WON, REWARD_SCORE):
        env = make_env(EnvConfig(max_steps=len(SANDBOX_WALK), reward=mode), expert=True)
        try:
            obs, info = env.reset(game.task)
            assert obs.startswith("Location: Attic") and "apple" in obs
            assert env.expert_action() is None  # nothing to plan for
            for action in SANDBOX_WALK:
                assert action in info[ADMISSIBLE]
                obs, reward, terminated, truncated, info = env.step(action)
                assert reward == 0 and not terminated and not info[WON]
                assert info[NORM_SCORE] == 0.0
            assert truncated and "Inventory: nothing" in obs  # the apple was dropped
        finally:
            env.close()
    # its steps are records like any other (the instruction may be empty)
    step = {"id": "t0", "task_id": game.task.task_id, "env": "textworld", "episode_id": "e0"}
    Transition.model_validate(
        {
            **step,
            "step_index": 0,
            "instruction": game.task.instruction,
            "state": "s",
            "action": "look",
            "next_state": "s",
            "reward": 0,
            "done": False,
            "valid_action": True,
            "source": "real",
            "provenance": {"policy": "random"},
        }
    )


def test_task_validation_stays_strict_around_an_empty_instruction(games: dict[str, Game]):
    task = games[SANDBOX].task.model_dump()
    assert Task.model_validate({**task, "instruction": "Explore."}).instruction == "Explore."
    for field, bad in (("task_id", ""), ("env", ""), ("split", "holdout"), ("difficulty", -1)):
        with pytest.raises(ValidationError, match=field):
            Task.model_validate({**task, field: bad})
    with pytest.raises(ValidationError, match="instruction"):
        Task.model_validate({k: v for k, v in task.items() if k != "instruction"})


def test_a_glulx_game_is_quarantined_with_how_to_fix_it(tmp_path: Path):
    from components.envs.external import games_tasks

    (tmp_path / "old.ulx").write_bytes(b"Glul" + bytes(60))
    (tmp_path / "old.json").write_text("{}")
    found = games_tasks(tmp_path, tmp_path, "test", "mine")
    assert found.tasks == []
    [row] = found.quarantined
    assert row["source"].endswith("old.ulx") and "--format z8" in row["reasons"][0]
