"""Policy-level fidelity: per-family dream vs real rates, their errors and the gain check."""

from __future__ import annotations

import pytest

from components.evaluation.policy_fidelity import (
    markdown,
    method_fidelity,
    select_games,
    summarise,
)
from tests.factories import make_task


def _rows(method: str, side: str, wins: dict[str, list[int]], family: dict[str, str]):
    return [
        {"method": method, "side": side, "task_id": t, "family": family[t], "pass": p, "won": w}
        for t, ws in wins.items()
        for p, w in enumerate(ws)
    ]


FAMILY = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
# the dream is optimistic on family B only: real B never wins, dreamt B always does
SFT = _rows("sft", "dream", {"a1": [1, 0], "a2": [0, 0], "b1": [1, 1], "b2": [1, 1]}, FAMILY)
SFT += _rows("sft", "real", {"a1": [1, 0], "a2": [0, 0], "b1": [0, 0], "b2": [0, 0]}, FAMILY)


def test_optimism_shows_per_family_and_against_the_constant_baseline():
    f = method_fidelity(SFT)
    assert f["families"]["A"] == {"dream": 0.25, "real": 0.25, "gap": 0.0, "tasks": 2}
    assert f["families"]["B"]["gap"] == pytest.approx(1.0)
    assert f["dream"]["success"] == pytest.approx(0.625)
    assert f["real"]["success"] == pytest.approx(0.125)
    assert f["gap"]["diff"] == pytest.approx(0.5) and f["gap"]["tasks"] == 4
    # the dream errs by 1.0 on B: worse than predicting every family by the pooled real rate
    assert f["family_mae"] == pytest.approx(0.5)
    assert f["family_mae_constant"] == pytest.approx(0.125)
    assert f["episodes"] == 8
    assert f["env_errors"] == {"dream": 0, "real": 0}
    crashed = [{**r, "env_error": "EnvError: jvm died"} if r["side"] == "real" else r for r in SFT]
    assert method_fidelity(crashed)["env_errors"] == {"dream": 0, "real": 8}


def test_gain_is_compared_with_the_real_gain_and_no_change():
    rl = _rows("rl", "dream", {"a1": [1, 1], "a2": [1, 1], "b1": [1, 1], "b2": [1, 1]}, FAMILY)
    rl += _rows("rl", "real", {"a1": [1, 1], "a2": [1, 0], "b1": [0, 0], "b2": [0, 0]}, FAMILY)
    doc = summarise(SFT + rl, ["sft", "rl"])
    gain = doc["gains"]["rl-sft"]
    assert gain["dream"]["diff"] == pytest.approx(0.375)
    assert gain["real"]["diff"] == pytest.approx(0.25)
    assert gain["error"] == pytest.approx(0.125) and gain["gain_error_none"] == pytest.approx(0.25)
    assert gain["same_sign"] is True
    text = markdown("textworld", doc)
    assert "| sft | B | 100.0 | 0.0 | +100.0 |" in text and "gain rl-sft" in text


def test_a_method_that_did_not_play_is_left_out():
    doc = summarise(SFT, ["sft", "dreamgym_grpo"])
    assert list(doc["methods"]) == ["sft"] and doc["gains"] == {}


def test_games_are_a_seeded_sample_of_train_games_per_family():
    tasks = [make_task(f"q{i}", family="quest") for i in range(5)]
    tasks += [make_task(f"t{i}", family="treasure") for i in range(2)]
    tasks += [make_task("v0", family="quest", split="validation")]
    tasks += [make_task("g0", family="quest", generated=True)]
    picked = select_games(tasks, per_family=3, seed=0)
    assert [t.family for t in picked].count("quest") == 3
    assert {t.task_id for t in picked if t.family == "treasure"} == {"t0", "t1"}
    assert not {"v0", "g0"} & {t.task_id for t in picked}
    assert picked == select_games(tasks, per_family=3, seed=0)
    assert {t.task_id for t in select_games(tasks, 3, seed=1)} != {t.task_id for t in picked}


def _replayed(rows, replay_won: dict[tuple[str, int], int]):
    """Dream rows with the open-loop verdict of their actions; real rows unchanged."""
    return [
        {**r, "replay_won": bool(replay_won[(r["task_id"], r["pass"])])}
        if r["side"] == "dream"
        else r
        for r in rows
    ]


def test_open_loop_splits_the_gap_into_the_dreams_verdict_and_closed_loop_divergence():
    # dreamt B wins: half of them are real wins when replayed (the verdict is half wrong);
    # a1's dreamt loss wins when replayed (a missed win); a1's dreamt win replays as a win
    verdict = {("a1", 0): 1, ("a1", 1): 1, ("a2", 0): 0, ("a2", 1): 0}
    verdict |= {("b1", 0): 1, ("b1", 1): 1, ("b2", 0): 0, ("b2", 1): 0}
    f = method_fidelity(_replayed(SFT, verdict))
    loop = f["open_loop"]
    assert loop["success"]["success"] == pytest.approx(0.5)  # 4 of 8 replays win
    assert loop["verdict_error"]["diff"] == pytest.approx(0.625 - 0.5)
    assert loop["closed_loop_divergence"]["diff"] == pytest.approx(0.5 - 0.125)
    total = loop["verdict_error"]["diff"] + loop["closed_loop_divergence"]["diff"]
    assert total == pytest.approx(f["gap"]["diff"])  # the two parts add up to the gap
    assert (loop["dream_wins"], loop["precision"]) == (5, pytest.approx(3 / 5))
    # the trivial verdict "all dreamt episodes win" is right as often as the replays win
    assert loop["precision_baseline"] == pytest.approx(0.5)
    assert (loop["dream_losses"], loop["missed_wins"]) == (3, 1)
    assert f["families"]["B"]["open_loop"] == pytest.approx(0.5)
    text = markdown("scienceworld", {"methods": {"sft": f}, "gains": {}})
    assert "| sft | open loop (dreamt actions, real env) | 50.0 | precision 60.0" in text
    assert "1/3 losses win | verdict +12.5, divergence +37.5 |" in text
    assert "open_loop" not in method_fidelity(SFT)  # nothing replayed: no split


def test_the_gains_open_loop_part_is_the_real_gain_of_the_dreamt_actions():
    rl = _rows("rl", "dream", {"a1": [1, 1], "a2": [1, 1], "b1": [1, 1], "b2": [1, 1]}, FAMILY)
    rl += _rows("rl", "real", {"a1": [1, 1], "a2": [1, 0], "b1": [0, 0], "b2": [0, 0]}, FAMILY)
    sft_won = {("a1", 0): 1, ("a1", 1): 0, ("a2", 0): 0, ("a2", 1): 0}
    sft_won |= {("b1", 0): 0, ("b1", 1): 0, ("b2", 0): 0, ("b2", 1): 0}
    rl_won = {("a1", 0): 1, ("a1", 1): 1, ("a2", 0): 1, ("a2", 1): 1}
    rl_won |= {("b1", 0): 1, ("b1", 1): 0, ("b2", 0): 0, ("b2", 1): 0}
    rows = _replayed(SFT, sft_won) + _replayed(rl, rl_won)
    gain = summarise(rows, ["sft", "rl"])["gains"]["rl-sft"]
    # replays: rl wins 5 of 8, sft 1 of 8, paired over the 4 games
    assert gain["open_loop"]["diff"] == pytest.approx(5 / 8 - 1 / 8)
    assert gain["open_loop"]["tasks"] == 4
    assert "open_loop" not in summarise(SFT + rl, ["sft", "rl"])["gains"]["rl-sft"]
    text = markdown("textworld", summarise(rows, ["sft", "rl"]))
    assert "| gain rl-sft | open loop (dreamt actions, real env) | +50.0 | | |" in text


class _Lock:
    """A real-env stand-in for the replay's bookkeeping: wins on 'open' after 'key',
    ends the episode on 'quit'."""

    name = "lock"

    def reset(self, task, seed=None):
        self.seen = []
        return "a locked door", {}

    def step(self, action):
        self.seen.append(action)
        won = self.seen[-2:] == ["key", "open"]
        done = won or action == "quit"
        return "ok", float(won), done, False, {"won": won}

    def close(self):
        pass


def test_replay_plays_each_dreamt_episodes_actions_open_loop():
    from components.envs.vector import EnvList
    from components.stages.policy_fidelity import replay

    games = {t: make_task(task_id=t) for t in ("g1", "g2", "g3")}
    rows = [
        {"task_id": "g1", "actions": ["look", "key", "open"]},  # wins on its last step
        {"task_id": "g2", "actions": ["quit", "key", "open"]},  # over before the win
        {"task_id": "g3", "actions": ["key"]},  # too short
        {"task_id": "g1", "actions": ["key", "open", "look", "look"]},  # wins, then ended
    ]
    venv = EnvList(factory=_Lock)
    replay(venv, games, rows, chunk=3)
    assert [r["replay_won"] for r in rows] == [True, False, False, True]
    assert venv.real_steps == 3 + 1 + 1 + 2  # nothing is stepped after an episode ends
