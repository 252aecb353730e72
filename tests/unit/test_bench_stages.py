"""bench/stages.py keys every MLflow stage run by its dvc.yaml stage name."""

from __future__ import annotations

from pathlib import Path

from bench.stages import dvc_name, dvc_stage_order, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_old_and_current_mlflow_names_map_to_dvc_stages():
    assert dvc_name("train_sft_baseline") == dvc_name("train_sft") == "train_sft"
    assert dvc_name("build_table1") == "table1"
    assert dvc_name("evaluate_dpo") == dvc_name("evaluate_policy@dpo") == "evaluate_policy@dpo"
    assert dvc_name("evaluate_fidelity") == "evaluate_fidelity"
    # the random baseline logs as evaluate_policy@random but is its own stage
    assert dvc_name("evaluate_policy@random") == dvc_name("evaluate_random") == "evaluate_random"
    assert dvc_name("train_experience_model", "full") == "train_experience_model@full"
    assert dvc_name("train_experience_model@no_history", "no_history") == (
        "train_experience_model@no_history"
    )


def test_summary_lists_only_stages_without_a_run_as_missing():
    order = dvc_stage_order(ROOT)
    runs = [
        {"stage": dvc_name(name), "start_ms": i, "seconds": 1.0 + i}
        for i, name in enumerate(["collect", "evaluate_sft", "build_table1", "train_rl_real@grpo"])
    ]
    out = summarize(runs, order)
    assert list(out["seconds"]) == [
        "collect",
        "train_rl_real@grpo",
        "evaluate_policy@sft",
        "table1",
    ]
    assert {"collect", "evaluate_policy", "table1", "train_rl_real"}.isdisjoint(out["missing"])
    assert "judge" in out["missing"]
