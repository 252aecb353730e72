"""The one-screen headline DVC shows: metrics/headline/*.json (issue 23, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from components.evaluation.headline import (
    FIDELITY_HEADLINE,
    HEADLINE_DIR,
    TABLE1_HEADLINE,
    build_headline,
)

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_headline_copies_success_fidelity_and_run_time(tmp_path: Path):
    row = {"success": 0.83838, "ci_low": 0.7, "ci_high": 0.9}
    table = {"_headline": "sampled", "_provenance": {}, "textworld": {"sft": row, "dpo": None}}
    _write(tmp_path / "table1.json", table)
    fidelity = {
        "reward_accuracy": 0.97,
        "majority_baseline_reward_accuracy": 0.93,
        "success_f1": 0.8,
        "always_win_baseline_success_f1": 0.12,
        "state_token_f1": 0.78,
        "copy_baseline_state_token_f1": 0.73,
        "admissible_f1": 0.84,
        "copy_baseline_admissible_f1": 0.81,
        "eps_R": 0.02,
        "n": 1451,
    }
    _write(tmp_path / "fidelity.json", {"full": fidelity})
    _write(tmp_path / "agent" / "sft.json", {"wall_seconds": 60.0})
    # GRPO and PPO share one stage, so its wall time counts once
    _write(tmp_path / "agent" / "grpo_real.json", {"stage": "train_real_rl", "wall_seconds": 120.0})
    _write(tmp_path / "agent" / "ppo_real.json", {"stage": "train_real_rl", "wall_seconds": 120.0})

    headline = build_headline(tmp_path, "textworld")

    assert headline["success"] == {"sft": 0.8384}  # a method not evaluated is left out
    assert headline["fidelity"] == {
        "reward_acc": 0.97,
        "reward_acc_majority": 0.93,
        "success_f1": 0.8,
        "success_f1_always_win": 0.12,
        "state_f1": 0.78,
        "state_f1_nochange": 0.73,
        "commands_f1": 0.84,
        "commands_f1_stay": 0.81,
        "eps_R": 0.02,
    }
    assert headline["train_minutes"] == 3.0


def test_headline_of_missing_inputs_is_empty_not_invented(tmp_path: Path):
    assert build_headline(tmp_path) == {}


def test_the_headline_files_are_the_only_dvc_metrics():
    """`dvc metrics show` / `dvc exp show` print the headline; the rest are plain outputs.

    Each part is declared by the stage that computes its figures (no stale headline after
    a partial `dvc exp run`)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    declared = []
    for name, stage in stages.items():
        for entry in stage.get("do", stage).get("metrics", []):
            declared.append((name, entry if isinstance(entry, str) else next(iter(entry))))
    assert sorted(declared) == [
        ("evaluate_fidelity", f"metrics/{HEADLINE_DIR}/{FIDELITY_HEADLINE}"),
        ("table1", f"metrics/{HEADLINE_DIR}/{TABLE1_HEADLINE}"),
    ]
