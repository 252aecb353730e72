"""The artifact layout: every name and location the stages, dvc.yaml, flows and bench share."""

from __future__ import annotations

from pathlib import Path

import pytest

from components import artifacts as a
from components.config import Paths

ROOT = Path("/project")
P = Paths(ROOT)


def test_method_names() -> None:
    assert (a.SFT, a.DPO, a.RANDOM) == ("sft", "dpo", "random")
    assert a.ALGOS == ("grpo", "ppo")
    assert [a.method_of(k, "grpo") for k in (a.REAL, a.DREAMGYM, a.S2R)] == [
        "grpo_real",
        "dreamgym_grpo",
        "s2r_grpo",
    ]
    assert (a.real_method("ppo"), a.dreamgym_method("ppo"), a.s2r_method("ppo")) == (
        "ppo_real",
        "dreamgym_ppo",
        "s2r_ppo",
    )
    with pytest.raises(ValueError, match="unknown RL algorithm 'sac'"):
        a.real_method("sac")


def test_table1_methods() -> None:
    assert a.METHODS == (
        "random",
        "sft",
        "dpo",
        "grpo_real",
        "ppo_real",
        "dreamgym_grpo",
        "dreamgym_ppo",
        "s2r_grpo",
        "s2r_ppo",
    )


def test_variants() -> None:
    assert a.VARIANTS == ("full", "no_reasoning", "no_history", "no_replay")
    with pytest.raises(ValueError, match="unknown variant 'bad'"):
        a.experience_model_dir(P, "bad")


def test_model_locations() -> None:
    assert a.policy_dir(P, "dreamgym_grpo") == ROOT / "models/policy/dreamgym_grpo"
    assert a.policy_dir(P, "dreamgym_grpo", 1) == ROOT / "models/policy/dreamgym_grpo/seed-1"
    assert a.seed_dir(a.policy_dir(P, "sft"), 2) == a.policy_dir(P, "sft", 2)
    assert a.policy_checkpoint_dir(P, "s2r_ppo", 0) == (
        ROOT / "models/checkpoints/policy/s2r_ppo/seed-0"
    )
    assert a.snapshots_dir(P, "dreamgym_ppo") == ROOT / "models/snapshots/dreamgym_ppo"
    assert a.snapshots_dir(P, "dreamgym_ppo", 3) == ROOT / "models/snapshots/dreamgym_ppo/seed-3"
    assert a.experience_model_dir(P) == ROOT / "models/experience/full"
    assert a.experience_model_dir(P, "no_replay") == ROOT / "models/experience/no_replay"
    assert a.experience_checkpoint_dir(P, "no_history") == (
        ROOT / "models/checkpoints/experience/no_history"
    )
    assert a.base_cache_dir(P) == ROOT / "models/base"


def test_metrics_and_data_locations() -> None:
    assert a.eval_file(P, "sft") == ROOT / "metrics/eval/sft.json"
    assert a.episodes_file(P, "random") == ROOT / "data/eval/random.jsonl"
    assert a.agent_metrics_file(P, "grpo_real") == ROOT / "metrics/agent/grpo_real.json"
    assert a.history_file(P, "s2r_grpo") == ROOT / "metrics/history/s2r_grpo.jsonl"
    assert a.history_plot_file(P, "s2r_grpo") == ROOT / "metrics/history/s2r_grpo.json"
    assert a.synthetic_dir(P) == ROOT / "data/synthetic"
    assert a.synthetic_file(P, "grpo") == ROOT / "data/synthetic/dreamgym_grpo.jsonl"
    assert a.synthetic_file(P, "ppo", 1) == ROOT / "data/synthetic/dreamgym_ppo/seed-1.jsonl"
    assert a.coevolved_dir(P, "grpo") == ROOT / "data/coevolved/dreamgym_grpo"
    assert a.coevolved_dir(P, "grpo", 0) == ROOT / "data/coevolved/dreamgym_grpo/seed-0"


def test_dvc_yaml_names_the_same_locations() -> None:
    dvc = (Path(__file__).resolve().parents[2] / "dvc.yaml").read_text(encoding="utf-8")
    root = Paths(Path("."))
    expected = [a.experience_model_dir(root), a.policy_dir(root, a.SFT), a.policy_dir(root, a.DPO)]
    for algo in a.ALGOS:  # every algorithm of the RL stages
        per_algo = dvc.replace("${item}", algo)
        dg = a.dreamgym_method(algo)
        for path in (
            a.policy_dir(root, a.real_method(algo)),
            a.history_file(root, a.real_method(algo)),
            a.history_plot_file(root, dg),
            a.policy_dir(root, dg),
            a.snapshots_dir(root, dg),
            a.synthetic_file(root, algo),
            a.coevolved_dir(root, algo),
        ):
            assert path.as_posix() in per_algo, path
    for path in expected:
        assert path.as_posix() in dvc, path


def test_dvc_lock_holds_only_stages_of_dvc_yaml() -> None:
    """DVC never drops a lock entry whose stage left dvc.yaml; DVC parses and rewrites the
    whole lock after every stage, so a stale entry costs every stage of every run."""
    import yaml

    repo = Path(__file__).resolve().parents[2]
    stages = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    names = {
        f"{name}@{item}" if "foreach" in stage else name
        for name, stage in stages.items()
        for item in stage.get("foreach", [None])
    }
    lock = yaml.safe_load((repo / "dvc.lock").read_text(encoding="utf-8"))["stages"]
    assert not sorted(set(lock) - names)
