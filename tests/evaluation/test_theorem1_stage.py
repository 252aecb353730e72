"""The theorem1 stage on a real TextWorld game: each term comes from the right round."""

from __future__ import annotations

import json
import shutil

import pytest

from components.config import Paths, Theorem1Config
from components.schema import Trajectory, write_jsonl
from components.stages.theorem1 import measure_run, theorem1
from tests.evaluation.conftest import play, suite_config, with_steps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HISTORY = [  # rounds 0, 1, 2: success of the round's synthetic episodes, the update's KL
    {"iteration": 1, "success_rate": 0.0, "policy_kl": 0.01, "mean_turns": 3.0},
    {"iteration": 2, "success_rate": 0.5, "policy_kl": 0.02, "mean_turns": 3.0},
    {"iteration": 3, "success_rate": 0.25, "policy_kl": 0.0, "mean_turns": 4.0},
]


def _in_round(traj: Trajectory, k: int) -> Trajectory:
    steps = [
        s.model_copy(
            update={
                "provenance": s.provenance.model_copy(
                    update={"iteration": k, "checkpoint": f"seed-0/round-{k}"}
                )
            }
        )
        for s in traj.steps
    ]
    return traj.model_copy(update={"steps": steps})


@pytest.fixture
def project(tw_games, tmp_path):
    """A project with one DreamGym run's history and synthetic rounds (no snapshots)."""
    from components.envs.textworld_env import TextWorldEnv

    root = tmp_path / "proj"
    shutil.copytree(tw_games.root, root)
    paths = Paths(root)
    task = tw_games.tasks[0]
    env = TextWorldEnv(max_steps=12, root=root)
    try:
        faithful = play(env, task, list(task.walkthrough or []))
    finally:
        env.close()
    last = faithful.n_steps - 1
    wrong_reward = with_steps(faithful, **{f"s{last}": {"reward": 0}})
    rounds = [_in_round(faithful, 0), _in_round(faithful, 1), _in_round(wrong_reward, 2)]
    write_jsonl(paths.data / "synthetic" / "dreamgym_grpo.jsonl", rounds)
    history = paths.metrics / "history" / "dreamgym_grpo.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps(r) + "\n" for r in HISTORY))
    (root / "models" / "snapshots" / "dreamgym_grpo" / "seed-0").mkdir(parents=True)
    cfg = suite_config().model_copy(update={"theorem1": Theorem1Config(algos=["grpo"])})
    return cfg, paths, faithful.n_steps


def test_terms_come_from_the_round_of_each_update(project, tw_games):
    from components.envs import make_env

    cfg, paths, n_steps = project
    env = make_env(cfg.env, paths.root)
    try:
        records, extras = measure_run(cfg, paths, "grpo", env, tw_games.by_id())
    finally:
        env.close()
    assert [r.iteration for r in records] == [1, 2]
    one, two = records
    # update 1: pi_0 -> pi_1; its gain is round 1 - round 0, its KL the first update's
    assert one.surrogate_gain == pytest.approx(0.5) and one.kl == pytest.approx(0.01)
    assert (one.eps_R, one.eps_P, one.horizon) == (0.0, 0.0, 3.0)
    # round 2's (pi_2's) transitions got the last reward wrong: eps_R = 1 / steps
    assert two.surrogate_gain == pytest.approx(-0.25) and two.kl == pytest.approx(0.02)
    assert two.eps_R == pytest.approx(1 / n_steps) and two.eps_P == 0.0 and two.horizon == 4.0
    assert one.real_gain is None and extras["snapshots"] == 0  # no snapshots: no real gain
    assert extras["rounds"] == 3 and extras["eval_real_steps"] == 0


def test_stage_writes_the_runs_and_respects_max_rounds(project):
    cfg, paths, _ = project
    t1 = cfg.theorem1.model_copy(update={"max_rounds": 2})
    summary = theorem1(cfg.model_copy(update={"theorem1": t1}), paths)
    doc = json.loads((paths.metrics / "theorem1.json").read_text())
    run = doc["runs"]["dreamgym_grpo"]
    assert [r["iteration"] for r in run["iterations"]] == [1] and run["rounds_measured"] == 2
    assert summary["dreamgym_grpo"]["n_iterations"] == 1 and "H^2" in doc["formula"]
    (row,) = run["iterations"]
    assert row["bound"] == pytest.approx(0.5 - 4 * 9 * 0.01 - 0.0)
