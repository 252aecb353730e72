"""Held-out evaluation (episodes, real steps, Wilson intervals), Table 1, and the stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.agent.evaluate import EpisodeRecord, EvalResult, held_out_tasks
from components.agent.table1 import (
    CROSSED,
    DIFFERENCE,
    METHODS,
    TASKS_ONLY,
    build_table,
    cluster_bootstrap,
    crossed_bootstrap,
    diff_cell,
    keep_other_envs,
    markdown,
    mode_summary,
    paired_difference,
)
from components.evaluation.fidelity import wilson_interval

ROOT = Path(__file__).resolve().parents[2]


def _episode(task: str, seed: int, success: bool, steps: int = 3, malformed: int = 0):
    return EpisodeRecord(task, seed, success, steps, malformed, malformed, not success)


def test_summary_pools_seeds_with_a_wilson_interval():
    episodes = [_episode(f"t{i}", 0, i < 3) for i in range(5)]
    episodes += [_episode(f"t{i}", 1, i < 1, steps=4, malformed=2) for i in range(5)]
    s = EvalResult(episodes, seeds=(0, 1), seeds_requested=(0, 1), seconds=1.0).summary()
    assert s["episodes"] == 10 and s["successes"] == 4 and s["success"] == pytest.approx(0.4)
    assert (s["ci_low"], s["ci_high"]) == pytest.approx(wilson_interval(4, 10))
    assert s["ci_low"] < 0.4 < s["ci_high"]
    assert s["per_seed"] == {
        "0": {"episodes": 5, "successes": 3, "success": 0.6},
        "1": {"episodes": 5, "successes": 1, "success": 0.2},
    }
    assert s["seeds"] == 2 and s["tasks"] == 5
    assert s["eval_real_steps"] == 5 * 3 + 5 * 4
    assert s["malformed"] == 10 and s["malformed_rate"] == pytest.approx(10 / 35)


@pytest.mark.integration
def test_held_out_tasks_are_the_test_split(agent_tw_suite):
    tasks = held_out_tasks(agent_tw_suite.tasks)
    assert tasks and {t.split for t in tasks} == {"test"}


@pytest.mark.integration
def test_untrained_policy_uses_exactly_max_steps_per_episode(agent_tw_suite):
    """A random tiny model answers malformed text: every step is one counted real step."""
    import torch

    from components.agent.evaluate import TransformersPolicy, evaluate
    from components.agent.policy import PolicySettings
    from components.envs.textworld_env import TextWorldEnv
    from components.lm.models import build_tiny_model
    from components.lm.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    tasks = agent_tw_suite.tasks[:3]
    max_steps = 4
    tokenizer = train_tokenizer([t.instruction for t in tasks] * 20, vocab_size=300)
    model = build_tiny_model("nano", tokenizer)
    policy = TransformersPolicy(model, tokenizer, PolicySettings(), max_new_tokens=8)

    def make_env():
        return TextWorldEnv(max_steps=max_steps, root=agent_tw_suite.root)

    result = evaluate(policy, tasks, make_env, seeds=(0, 1, 2), greedy=True, parallel=2)
    s = result.summary()
    assert result.seeds == (0,) and s["seeds_requested"] == 3  # greedy: seeds would repeat
    assert s["episodes"] == 3 and s["successes"] == 0 and s["truncated"] == 3
    assert s["eval_real_steps"] == 3 * max_steps == s["malformed"] == s["invalid_actions"]
    assert (s["ci_low"], s["ci_high"]) == pytest.approx(wilson_interval(0, 3))
    assert [e.task_id for e in result.episodes] == [t.task_id for t in tasks]
    assert all(set(e.actions) == {"noop"} for e in result.episodes)

    sampled = evaluate(policy, tasks[:1], make_env, seeds=(0, 1), greedy=False, parallel=2)
    assert sampled.seeds == (0, 1) and sampled.summary()["eval_real_steps"] == 2 * max_steps


def _rows(method_success: dict[str, list[int]], mode: str = "sampled", seed: int = 0):
    """Episode rows of one mode: task t<i> succeeded or not."""
    return [
        {"task_id": f"t{i}", "seed": seed, "mode": mode, "success": s}
        for i, s in enumerate(method_success)
    ]


def test_cluster_bootstrap_keeps_a_tasks_seeds_together_and_brackets_the_mean():
    values = {f"t{i}": [1.0, 1.0] if i < 6 else [0.0, 0.0] for i in range(10)}
    lo, hi = cluster_bootstrap(values)
    assert lo < 0.6 < hi and lo >= 0 and hi <= 1
    lo, hi = cluster_bootstrap({"t": [1.0, 1.0]})
    assert hi == 1.0 and lo == pytest.approx(0.21, abs=0.01)  # one task: 1/1 is weak evidence
    assert cluster_bootstrap({}) == (0.0, 1.0)  # nothing measured: the widest interval


def test_crossed_bootstrap_widens_the_interval_when_training_seeds_disagree():
    # every task scores 1.0 under seed 0 and 0.2 or 0.6 under seeds 1 and 2: resampling
    # tasks alone hides that a rerun with other seeds could land anywhere from 0.2 to 1.0
    cells = {f"t{i}": {0: 1.0, 1: 0.2, 2: 0.6} for i in range(20)}
    cells["t0"] = {0: 0.0, 1: 0.2, 2: 0.6}  # one task differs, so tasks vary a little too
    lo, hi = crossed_bootstrap(cells)
    tasks_lo, tasks_hi = cluster_bootstrap({t: list(v.values()) for t, v in cells.items()})
    assert lo < tasks_lo and hi > tasks_hi and 0.2 <= lo < 0.55 < hi <= 1.0
    # one seed: the seed draw is a no-op, so it is the task bootstrap's interval
    one = {t: {0: v[0]} for t, v in cells.items()}
    assert crossed_bootstrap(one) == pytest.approx(
        cluster_bootstrap({t: [v[0]] for t, v in cells.items()}), abs=0.05
    )
    # a missing (task, seed) cell is skipped, never counted as a failure
    lo, hi = crossed_bootstrap({"a": {0: 1.0}, "b": {1: 1.0}})
    assert hi == 1.0 and lo == pytest.approx(1 - 3.84 / 5.84, abs=0.01)
    assert crossed_bootstrap({}) == (0.0, 1.0)


def test_an_interval_never_collapses_when_every_task_scores_the_same():
    """0 of 101 games won is not "exactly 0": the bootstrap's zero-width interval is
    widened to the Wilson bound over games (~3.8 / n), for rates and for differences."""
    lost = {f"t{i}": {s: 0.0 for s in range(3)} for i in range(101)}
    won = {t: {s: 1.0 for s in v} for t, v in lost.items()}
    u = 1.96**2 / (101 + 1.96**2)
    assert crossed_bootstrap(lost) == pytest.approx((0.0, u), abs=1e-3)
    assert crossed_bootstrap(won) == pytest.approx((1.0 - u, 1.0), abs=1e-3)
    assert crossed_bootstrap(lost, bounds=DIFFERENCE) == pytest.approx((-u, u), abs=1e-3)
    assert cluster_bootstrap({t: list(v.values()) for t, v in won.items()}) == pytest.approx(
        (1.0 - u, 1.0), abs=1e-3
    )
    same = paired_difference(_rows([0, 0, 0, 0]), _rows([0, 0, 0, 0]))
    assert same is not None and same["ci_low"] < 0 < same["ci_high"]


def test_paired_difference_subtracts_the_same_task_and_seed():
    method = _rows([1, 1, 1, 0]) + _rows([1, 1, 0, 0], seed=1)
    base = _rows([0, 1, 0, 0]) + _rows([0, 1, 0, 0], seed=1)
    diff = paired_difference(method, base)
    assert diff["pairs"] == 8 and diff["diff"] == pytest.approx(3 / 8)
    assert diff["ci_low"] <= diff["diff"] <= diff["ci_high"]
    assert paired_difference(method, _rows([1], mode="greedy")) is None  # nothing shared


def test_evaluation_passes_are_averaged_per_task_and_seed():
    # two sampled passes of seed 0 and one of seed 1 on two tasks: 6 episodes
    rows = _rows([1, 0]) + _rows([1, 1]) + _rows([0, 0], seed=1)
    head = mode_summary(rows, "sampled")
    assert head["episodes"] == 6 and head["tasks"] == 2 and head["seeds"] == 2
    # (task, seed) means: t0 {0: 1, 1: 0}, t1 {0: .5, 1: 0}
    assert head["success"] == pytest.approx(1.5 / 4)
    assert head["per_seed"] == {"0": 0.75, "1": 0.0}
    # each seed's own interval, over tasks (seed 1 lost everywhere: never zero-width)
    assert head["per_seed_ci"]["0"]["ci_low"] <= 0.75 <= head["per_seed_ci"]["0"]["ci_high"]
    assert head["per_seed_ci"]["1"]["ci_low"] == 0.0 < head["per_seed_ci"]["1"]["ci_high"]
    diff = paired_difference(rows, _rows([0, 0]) + _rows([0, 0], seed=1))
    assert diff["pairs"] == 4 and diff["diff"] == pytest.approx(1.5 / 4)


def test_table1_has_every_method_random_first_and_never_fills_in():
    episodes = {
        "random": _rows([0, 1, 0, 0]),
        "sft": _rows([1, 1, 0, 1]) + _rows([1, 1, 1, 1], mode="greedy"),
        "grpo_real": _rows([1, 1, 1, 1]),
        "expert": _rows([1, 1, 1, 1]),  # not a Table-1 method: left out
    }
    table = build_table("textworld", episodes, {"sft": 0, "grpo_real": 4000})
    rows = table["textworld"]
    assert list(rows) == list(METHODS) and METHODS[0] == "random"
    assert rows["sft"]["success"] == 0.75 and rows["sft"]["greedy"]["success"] == 1.0
    assert rows["sft"]["vs_random"]["diff"] == 0.5 and "vs_sft" not in rows["sft"]
    assert rows["grpo_real"]["vs_sft"]["diff"] == 0.25 and rows["grpo_real"]["real_steps"] == 4000
    assert rows["random"]["real_steps"] is None  # not given: never invented
    assert [m for m, r in rows.items() if r is None] == [
        "dpo",
        "ppo_real",
        "dreamgym_grpo",
        "dreamgym_ppo",
        "s2r_grpo",
        "s2r_ppo",
    ]
    text = markdown(table)
    assert "| Random (admissible) | 25.0 (" in text and "| SFT | 75.0 (" in text
    assert "| DreamGym GRPO | not evaluated |" in text and "4,000" in text
    assert markdown({}).startswith("No policy")


def test_table1_counts_and_says_the_episodes_the_env_broke():
    broken = [{**r, "success": 0, "env_error": "EnvError: jvm died"} for r in _rows([0, 0])]
    episodes = {"sft": _rows([1, 1]) + broken, "random": _rows([0, 0, 0, 0])}
    rows = build_table("textworld", episodes, {})["textworld"]
    assert rows["sft"]["env_errors"] == 2 and rows["random"]["env_errors"] == 0
    text = markdown(build_table("textworld", episodes, {}))
    assert "Episodes the env broke, counted as failures: SFT 2" in text


def test_table1_pairs_the_dreamgym_rows_with_the_claims_they_test():
    episodes = {
        "sft": _rows([0, 0, 0, 0]),
        "grpo_real": _rows([1, 1, 0, 0]),
        "dreamgym_grpo": _rows([1, 0, 0, 0]),
        "s2r_grpo": _rows([1, 1, 1, 0]),
        "s2r_ppo": _rows([1, 1, 1, 1]),  # its references were not evaluated
    }
    rows = build_table("textworld", episodes, {})["textworld"]
    assert rows["dreamgym_grpo"]["vs_real_rl"]["diff"] == -0.25
    assert "vs_dreamgym" not in rows["dreamgym_grpo"]
    assert rows["s2r_grpo"]["vs_real_rl"]["diff"] == 0.25
    assert rows["s2r_grpo"]["vs_dreamgym"]["diff"] == 0.5
    assert not {"vs_real_rl", "vs_dreamgym"} & set(rows["s2r_ppo"])  # never against GRPO's
    assert not {"vs_real_rl", "vs_dreamgym"} & set(rows["grpo_real"])
    line = next(x for x in markdown({"textworld": rows}).splitlines() if "S2R GRPO" in x)
    assert "| +25.0 (" in line and "| +50.0 (" in line


def test_table1_cells_round_and_never_print_minus_zero():
    assert diff_cell({"diff": 0.0444, "ci_low": -1.9e-18, "ci_high": 0.0944}) == (
        "+4.4 (+0.0, +9.4)"
    )
    episodes = {"grpo_real": _rows([1, 1, 1, 1])}
    table = build_table("textworld", episodes, {"grpo_real": 99.67})  # a mean over seeds
    assert "| 100 |" in markdown(table)


@pytest.mark.integration
def test_stages_train_evaluate_and_tabulate_the_baselines(agent_tw_suite, tmp_path):
    """SFT -> DPO -> held-out evaluation (random beside them) -> Table 1, real TextWorld."""
    import shutil

    import mlflow
    import torch

    from components.artifacts import episodes_file, policy_dir
    from components.config import Paths, load_config
    from components.data.collect import collect
    from components.schema import Trajectory, read_jsonl, write_jsonl
    from components.stages.agent import (
        REGISTERED_MODEL,
        build_table1,
        evaluate_policy,
        train_dpo_baseline,
        train_sft_baseline,
    )

    torch.set_num_threads(1)
    suite = agent_tw_suite
    cfg = load_config(ROOT / "params.yaml", profile="ci")
    cfg = cfg.model_copy(update={"env": suite.cfg.env, "collect": suite.cfg.collect})
    paths = Paths(tmp_path)
    shutil.copytree(suite.tasks_dir, paths.tasks)
    collect(cfg, suite.tasks, paths.raw, suite.root, progress=False)
    trajectories = [t for f in sorted(paths.raw.glob("*.jsonl")) for t in read_jsonl(f, Trajectory)]
    assert {t.split for t in trajectories} == {"train", "validation"}  # never test
    write_jsonl(paths.trajectories_file, trajectories)

    sft = train_sft_baseline(cfg, paths)
    assert sft["real_steps"] == 0 and sft["data_steps"] > 0
    assert (policy_dir(paths, "sft") / "seed-0" / "policy.json").exists()
    dpo = train_dpo_baseline(cfg, paths)
    assert dpo["real_steps"] == 0

    n_test = len(held_out_tasks(suite.tasks))
    for method in ("random", "sft", "dpo"):
        summary = evaluate_policy(cfg, paths, method)
        assert summary["split"] == "test" and summary["headline"] == "sampled"
        assert summary["episodes"] == n_test * len(cfg.agent.seeds)
        assert 0 < summary["eval_real_steps"] <= 2 * n_test * cfg.env.max_steps
        rows = [json.loads(line) for line in episodes_file(paths, method).read_text().splitlines()]
        assert {r["mode"] for r in rows} == (
            {"sampled"} if method == "random" else {"sampled", "greedy"}
        )
        assert {r["task_id"] for r in rows} == {t.task_id for t in held_out_tasks(suite.tasks)}

    table = build_table1(cfg, paths)["table"]
    on_disk = json.loads((paths.metrics / "table1.json").read_text())
    assert on_disk == table and on_disk["_provenance"]["profile"] == "ci"
    rows = on_disk["textworld"]
    assert rows["random"]["episodes"] == rows["sft"]["episodes"] == n_test
    assert "vs_random" in rows["sft"] and rows["grpo_real"] is None
    assert "| Random (admissible) |" in (paths.metrics / "table1.md").read_text()
    headline = json.loads((paths.metrics / "headline" / "table1.json").read_text())
    assert headline["success"]["sft"] == round(rows["sft"]["success"], 4)  # what DVC shows

    client = mlflow.MlflowClient()
    sft_version = client.get_model_version_by_alias(REGISTERED_MODEL, "sft")
    dpo_version = client.get_model_version_by_alias(REGISTERED_MODEL, "dpo")
    assert dpo_version.version != sft_version.version
    assert sft_version.tags["eval.episodes"] == str(n_test)
    # the version is one seed's policy: its own success beside the method's
    seed = str(cfg.seeds_of("sft")[0])
    assert float(sft_version.tags["eval.version_success"]) == pytest.approx(
        rows["sft"]["per_seed"][seed], abs=1e-4
    )


def test_table1_keeps_the_other_envs_rows_with_their_provenance():
    old = {
        "textworld": {"sft": {"success": 0.8}},
        "_provenance": {"git_commit": "aaa", "dirty": False, "profile": "cpu"},
        "_headline": "sampled",
    }
    sw = {"scienceworld": {"sft": {"success": 0.3}}, "_provenance": {"git_commit": "bbb"}}
    merged = keep_other_envs(sw, old, "scienceworld")
    assert merged["textworld"] == old["textworld"]
    assert merged["scienceworld"]["sft"]["success"] == 0.3
    assert merged["_provenance_by_env"]["textworld"]["git_commit"] == "aaa"  # from the old top
    assert merged["_provenance_by_env"]["scienceworld"]["git_commit"] == "bbb"
    # rerunning textworld replaces its rows and keeps scienceworld's with its provenance
    tw = {"textworld": {"sft": {"success": 0.9}}, "_provenance": {"git_commit": "ccc"}}
    again = keep_other_envs(tw, merged, "textworld")
    assert again["textworld"]["sft"]["success"] == 0.9
    assert again["_provenance_by_env"] == {
        "scienceworld": {"git_commit": "bbb"},
        "textworld": {"git_commit": "ccc"},
    }
    assert "_ci_by_env" not in again  # neither file says: policy fidelity's files stay as they are


def test_table1_says_how_each_envs_intervals_were_made():
    """A table built now resamples games and seeds; an env kept from an older table says
    its intervals resampled games only, in the JSON and the markdown."""
    old = build_table("scienceworld", {"sft": _rows([0, 1])}, {})
    del old["_ci_by_env"]  # as an older Table 1 was written
    table = build_table("textworld", {"sft": _rows([1, 0, 1, 1]) + _rows([0, 1], seed=1)}, {})
    assert table["_ci_by_env"] == {"textworld": CROSSED}
    merged = keep_other_envs(table, old, "textworld")
    assert merged["_ci_by_env"] == {"textworld": CROSSED, "scienceworld": TASKS_ONLY}
    # rerunning scienceworld with the new code relabels it; textworld's label is kept
    sw = build_table("scienceworld", {"sft": _rows([0, 1])}, {})
    again = keep_other_envs(sw, merged, "scienceworld")
    assert again["_ci_by_env"] == {"scienceworld": CROSSED, "textworld": CROSSED}
    text = markdown(merged)
    sw_part, tw_part = text.split("### textworld")
    assert f"bootstrap over {TASKS_ONLY};" in sw_part and f"over {CROSSED};" in tw_part


def test_table1_marks_the_rows_of_one_training_seed():
    # their intervals resample games only: beside 3-seed rows they would read as narrower
    two_seeds = _rows([1, 0, 1, 1]) + _rows([0, 1, 1, 1], seed=1)
    table = build_table("textworld", {"sft": two_seeds, "ppo_real": _rows([1, 1, 1, 0])}, {})
    text = markdown(table)
    assert "| PPO (real env) † |" in text and "| SFT |" in text
    assert "† one training seed: its intervals and paired differences resample games only" in text
    alone = markdown(build_table("textworld", {"ppo_real": _rows([1, 1, 1, 0])}, {}))
    assert "bootstrap over games (one training seed);" in alone and "†" not in alone


def test_envs_built_before_one_that_fails_are_closed():
    from components.agent.evaluate import run_episodes
    from tests.factories import make_task

    closed: list[int] = []

    class Built:
        def __init__(self, n: int) -> None:
            self.n = n

        def close(self) -> None:
            closed.append(self.n)

    made = iter(range(3))

    def make_env():
        n = next(made)
        if n == 2:
            raise RuntimeError("no third browser")
        return Built(n)

    tasks = [make_task(f"t{i}", "x", i) for i in range(4)]
    with pytest.raises(RuntimeError, match="third browser"):
        run_episodes(None, tasks, make_env, seed=0, parallel=4)
    assert sorted(closed) == [0, 1]
