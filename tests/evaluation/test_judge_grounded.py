"""The grounded judge against a real TextWorld game: faithful vs corrupted transitions."""

from __future__ import annotations

import pytest

from components.envs.textworld_env import TextWorldEnv
from components.evaluation.judge import GroundedJudge, make_judge, run_judge
from components.evaluation.theorem1 import model_errors
from tests.evaluation.conftest import Games, judge_config, play, with_steps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def env(tw_games: Games):
    e = TextWorldEnv(max_steps=12, root=tw_games.root)
    yield e
    e.close()


@pytest.fixture(scope="module")
def faithful(tw_games: Games, env: TextWorldEnv):
    """The walkthrough of the first game, as a perfect experience model would predict it."""
    task = tw_games.tasks[0]
    traj = play(env, task, list(task.walkthrough or []))
    assert traj.success and traj.n_steps >= 2
    return traj


def _judge(tw_games: Games, env: TextWorldEnv) -> GroundedJudge:
    return GroundedJudge(env, tw_games.by_id(), judge_config())


def test_faithful_transitions_score_two_on_every_step(tw_games, env, faithful):
    out = _judge(tw_games, env).judge([faithful])
    assert len(out.transitions) == faithful.n_steps
    for row in out.transitions:
        assert row["replayed"] and row["reward_match"] and row["state_em"]
        assert row["unknown_entities"] == []
        assert (row["consistency"], row["hallucination"], row["informativeness"]) == (2, 2, 2)
    (traj_row,) = out.rows
    assert traj_row["status"] == "ok" and traj_row["consistency"] == 2
    assert out.summary["consistency"]["distribution"] == {"0": 0, "1": 0, "2": 1}
    assert out.summary["transition_state_em"] == 1.0
    errors = model_errors(out.transitions)
    assert errors["eps_R"] == 0.0 and errors["eps_P"] == 0.0


def test_invented_objects_and_places_lower_consistency_and_hallucination(tw_games, env, faithful):
    invented = (
        "Location: Throne Room\nExits: north. A golden unicorn stands on a marble pedestal. "
        "On the floor: a crystal sword.\nInventory: nothing\nFeedback: You see a dragon."
    )
    bad = with_steps(faithful, s0={"next_state": invented})
    out = _judge(tw_games, env).judge([bad])
    first = out.transitions[0]
    assert first["consistency"] < 2 and first["hallucination"] == 0
    assert {"unicorn", "pedestal", "sword", "dragon", "room"} <= set(first["unknown_entities"])
    # the other steps are still faithful
    assert all(r["consistency"] == 2 for r in out.transitions[1:])


def test_mild_invention_is_partial_hallucination(tw_games, env, faithful):
    real_next = faithful.steps[0].next_state
    bad = with_steps(faithful, s0={"next_state": real_next + " You also notice a small lamp."})
    row = _judge(tw_games, env).judge([bad]).transitions[0]
    assert row["unknown_entities"] == ["lamp"]
    assert row["hallucination"] in (0, 1) and row["hallucination"] < 2


def test_wrong_reward_is_inconsistent(tw_games, env, faithful):
    last = faithful.n_steps - 1
    bad = with_steps(faithful, **{f"s{last}": {"reward": 0}})
    out = _judge(tw_games, env).judge([bad])
    row = out.transitions[last]
    assert not row["reward_match"] and row["state_em"] and row["consistency"] == 0
    errors = model_errors(out.transitions)
    assert errors["eps_R"] == pytest.approx(1 / faithful.n_steps) and errors["eps_P"] == 0.0


def test_copying_the_previous_state_is_uninformative(tw_games, env, faithful):
    copied = {f"s{i}": {"next_state": s.state} for i, s in enumerate(faithful.steps[:-1])}
    bad = with_steps(faithful, **copied)
    out = _judge(tw_games, env).judge([bad])
    for row in out.transitions[:-1]:
        # the world sentences that changed are missing: no credit for the change
        assert row["change_recall"] == 0.0 and row["informativeness"] <= 1
        assert row["consistency"] <= 1
    assert out.transitions[-1]["informativeness"] == 2
    assert out.rows[0]["informativeness_mean"] < 2


def test_steps_after_the_real_episode_ended_count_as_inconsistent(tw_games, env, faithful):
    # the synthetic world claims the game goes on after the real one was won
    extra = faithful.steps[-1].model_copy(
        update={"step_index": faithful.n_steps, "reward": 0, "done": False}
    )
    steps = [*faithful.steps[:-1], faithful.steps[-1].model_copy(update={"reward": 0}), extra]
    longer = faithful.model_copy(update={"steps": steps, "success": False})
    out = _judge(tw_games, env).judge([with_steps(longer)])
    last = out.transitions[-1]
    assert last["after_real_end"] and not last["replayed"] and last["consistency"] == 0
    assert out.summary["n_transitions_after_real_end"] == 1
    assert model_errors(out.transitions)["eps_P"] > 0


def test_unknown_and_generated_tasks_are_skipped_not_crashed(tw_games, env, faithful):
    task = tw_games.tasks[0]
    generated = task.model_copy(
        update={"task_id": "gen-1", "generated": True, "parent_task_id": task.task_id}
    )
    tasks = {**tw_games.by_id(), "gen-1": generated}
    judge = GroundedJudge(env, tasks, judge_config())
    ghost = faithful.model_copy(update={"task_id": "nowhere", "steps": []})
    gen = faithful.model_copy(update={"task_id": "gen-1", "steps": []})
    out = judge.judge([ghost, gen, faithful])
    assert [r["status"] for r in out.rows] == ["skipped", "skipped", "ok"]
    assert out.summary["n"] == 1 and out.summary["n_skipped"] == 2


def test_run_judge_samples_synthetic_trajectories_deterministically(tw_games, env, faithful):
    variants = [with_steps(faithful) for _ in range(1)]
    pool = [faithful, *variants]
    for i in range(4):
        pool.append(pool[0].model_copy(update={"episode_id": f"ep-{i}", "steps": []}))
    real = faithful.model_copy(update={"source": "real", "episode_id": "real-1"})
    judge = make_judge(judge_config(), env, tw_games.by_id())
    a = run_judge(judge, [*pool, real], n=2, seed=3)
    b = run_judge(judge, [real, *reversed(pool)], n=2, seed=3)
    # empty trajectories and real ones are never sampled; the sample ignores input order
    assert a.summary["n_sampled"] == 2 and a.summary["backend"] == "grounded"
    assert [r["episode_id"] for r in a.rows] == [r["episode_id"] for r in b.rows]
    assert "real-1" not in {r["episode_id"] for r in a.rows}
