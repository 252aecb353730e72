"""The promotion rule (pure cases) and its application through MLflow aliases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import Config, load_config
from components.evaluation.promotion import (
    CANDIDATE,
    CHAMPION,
    EXPERIENCE_FLOORS,
    HeldOutMetric,
    apply_policy_promotion,
    apply_promotion,
    baseline_tags,
    best_method,
    decide,
    floor_failure,
    higher_is_better,
    metric_from_tags,
    metric_tags,
    registry_target,
)

ROOT = Path(__file__).resolve().parents[2]


def m(value: float, low: float | None = None, high: float | None = None) -> HeldOutMetric:
    return HeldOutMetric(value, low, high)


@pytest.mark.parametrize(
    ("candidate", "champion", "promote", "why"),
    [
        (m(0.30, 0.2, 0.4), None, True, "no champion"),
        (m(0.41, 0.35, 0.47), m(0.40, 0.3, 0.5), False, "below margin"),  # +0.01 < 0.02
        (m(0.40, 0.3, 0.5), m(0.40, 0.3, 0.5), False, "below margin"),  # a tie never wins
        (m(0.30, 0.2, 0.4), m(0.40, 0.3, 0.5), False, "below margin"),  # worse
        (m(0.45, 0.30, 0.60), m(0.40, 0.3, 0.5), False, "CI lower bound"),  # 0.30 < 0.38
        (m(0.45, 0.39, 0.51), m(0.40, 0.3, 0.5), True, "CI lower bound 0.39"),
        (m(0.45, 0.38, 0.52), m(0.40, 0.3, 0.5), True, "improvement"),  # 0.38 == floor
        (m(0.45), m(0.40), True, "no CI"),  # no interval: the margin rule alone
    ],
)
def test_rule(candidate, champion, promote, why):
    d = decide(candidate, champion, margin=0.02)
    assert d.promote is promote and why in d.reason


def test_lower_is_better_metrics_are_oriented():
    assert not higher_is_better("eps_R") and higher_is_better("success")
    # eps_R 0.05 [0.03, 0.08] beats a champion at 0.10 by 0.05 >= 0.02, upper bound 0.08 <= 0.12
    assert decide(m(0.05, 0.03, 0.08), m(0.10), 0.02, higher=False).promote
    # upper bound 0.14 > 0.10 + 0.02: the candidate may be clearly worse
    assert not decide(m(0.05, 0.01, 0.14), m(0.10), 0.02, higher=False).promote
    assert not decide(m(0.12), m(0.10), 0.0, higher=False).promote


def test_margin_zero_still_needs_a_strict_improvement():
    assert not decide(m(0.4), m(0.4), 0.0).promote
    assert decide(m(0.41), m(0.4), 0.0).promote
    # decimal arithmetic: 0.41 - 0.40 is 0.00999... in floats, still exactly the margin
    assert decide(m(0.41), m(0.40), 0.01).promote
    assert decide(m(0.41, 0.39, 0.43), m(0.40), 0.01).promote  # lower bound == floor
    with pytest.raises(ValueError):
        decide(m(0.4), None, -0.1)


def test_metric_validation_and_tag_round_trip():
    with pytest.raises(ValueError):
        HeldOutMetric(0.5, 0.6, 0.7)  # interval excludes the value
    with pytest.raises(ValueError):
        HeldOutMetric(0.5, 0.4, None)
    with pytest.raises(ValueError):
        HeldOutMetric(float("nan"))
    metric = HeldOutMetric(0.425, 0.3, 0.55, n=40)
    tags = metric_tags("success", metric)
    assert tags["heldout.success"] == "0.425" and tags["heldout.success.n"] == "40"
    assert metric_from_tags(tags, "success") == metric
    assert metric_from_tags(tags, "eps_R") is None
    assert metric_from_tags({"heldout.success": "high"}, "success") is None


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_apply_promotion_moves_the_champion_alias(tmp_path: Path):
    from mlflow import MlflowClient

    from components import model_registry, tracking

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"\0" * 16)
    name = "policy"

    def register(value: float, low: float, high: float) -> str:
        with tracking.stage_run("evaluate", "agent", cfg, (), tmp_path) as run:
            version = model_registry.register_model_dir(run, model_dir, name, aliases=(CANDIDATE,))
            model_registry.tag_model_alias(
                name, CANDIDATE, metric_tags("success", m(value, low, high))
            )
        return version

    assert apply_promotion(tmp_path, name, "success", 0.02).reason.startswith("no policy@")
    v1 = register(0.30, 0.20, 0.40)
    d1 = apply_promotion(tmp_path, name, "success", 0.02)
    assert d1.promote and d1.candidate_version == v1 and d1.champion_version is None
    assert model_registry.model_version_by_alias(name, CHAMPION)[0] == v1
    assert apply_promotion(tmp_path, name, "success", 0.02).reason.startswith("candidate is")

    v2 = register(0.31, 0.21, 0.41)  # +0.01: kept out
    d2 = apply_promotion(tmp_path, name, "success", 0.02)
    assert not d2.promote and model_registry.model_version_by_alias(name, CHAMPION)[0] == v1
    tags = MlflowClient().get_model_version(name, v2).tags
    assert tags["promotion.decision"] == "kept champion" and tags["promotion.compared_to"] == v1

    v3 = register(0.50, 0.40, 0.60)
    d3 = apply_promotion(tmp_path, name, "success", 0.02)
    assert d3.promote and d3.champion_version == v1
    assert model_registry.model_version_by_alias(name, CHAMPION)[0] == v3
    assert MlflowClient().get_model_version(name, v3).tags["promotion.decision"] == "promoted"

    # another env's candidate was measured on other test tasks: never compared
    client = MlflowClient()
    client.set_model_version_tag(name, v3, "env", "textworld")
    v4 = register(0.90, 0.80, 0.95)
    client.set_model_version_tag(name, v4, "env", "scienceworld")
    d4 = apply_promotion(tmp_path, name, "success", 0.02)
    assert not d4.promote and "measured on env textworld, the candidate on scienceworld" in (
        d4.reason
    )
    assert model_registry.model_version_by_alias(name, CHAMPION)[0] == v3


# --- quality floors, ablations, policy@champion from Table 1 (issue 23, item 5) ----------


def _floor_tags(metric: str, value: float, baseline: float) -> dict[str, str]:
    return {**metric_tags(metric, m(value)), **baseline_tags(metric, baseline)}


def test_floor_refuses_a_candidate_not_above_its_trivial_baseline():
    tags = {
        **_floor_tags("reward_accuracy", 0.93, 0.9373),  # the majority class does better
        **_floor_tags("state_exact_match", 0.28, 0.04),
    }
    reason = floor_failure(tags, ("reward_accuracy", "state_exact_match"))
    assert reason == "reward_accuracy 0.9300 does not beat its baseline 0.9373"
    tie = _floor_tags("state_exact_match", 0.04, 0.04)  # "nothing changes" ties: refused
    assert "does not beat" in floor_failure(tie, ("state_exact_match",))
    assert "no held-out" in floor_failure(metric_tags("success", m(0.9)), ("success",))
    good = {**tags, **_floor_tags("reward_accuracy", 0.977, 0.937)}
    assert floor_failure(good, ("reward_accuracy", "state_exact_match")) is None
    assert floor_failure({}, ()) is None  # no floors asked: the old rule alone


def test_ablation_runs_register_apart_and_move_no_alias():
    on = {"no_replay": True, "no_history": False, "no_reasoning": True}
    assert registry_target("policy", (CANDIDATE, "sft"), on) == (
        "policy-ablation",
        (),
        {"ablation": "no_reasoning,no_replay"},
    )
    off = dict.fromkeys(on, False)
    assert registry_target("policy", (CANDIDATE, "sft"), off) == ("policy", (CANDIDATE, "sft"), {})


def test_best_method_ignores_random_and_missing_success():
    rows = {"random": {"success": 0.9}, "sft": {"success": 0.7}, "dpo": {"success": 0.76}}
    assert best_method({**rows, "ppo": {"success": None}}) == "dpo"
    assert best_method({"random": {"success": 0.2}}) is None


def test_a_method_is_ranked_and_tagged_with_its_registered_seeds_figures():
    """``policy@<method>`` is one seed's policy: the mean over seeds ranked a method whose
    registered policy scored lower than another's (MiniWoB++'s S2R vs DreamGym GRPO)."""
    from components.evaluation.promotion import _held_out_rows

    def row(mean: float, seed0: float) -> dict:
        ci = {"0": {"ci_low": seed0 - 0.03, "ci_high": seed0 + 0.03}}
        return {
            "success": mean,
            "ci_low": mean - 0.05,
            "ci_high": mean + 0.05,
            "per_seed": {"0": seed0, "1": 2 * mean - seed0},
            "per_seed_ci": ci,
        }

    rows = {
        "random": {"success": 0.2},
        "s2r_grpo": row(0.925, 0.917),
        "dreamgym_grpo": row(0.908, 0.933),
    }
    assert best_method(rows) == "s2r_grpo"  # no seed named: the mean over seeds
    assert best_method(rows, lambda m: 0) == "dreamgym_grpo"
    held = _held_out_rows(rows, lambda m: 0)["dreamgym_grpo"]
    assert (held.value, held.ci_low, held.ci_high) == pytest.approx((0.933, 0.903, 0.963))
    # a table without per-seed intervals (archived before them): the mean's figures
    old = {m: {k: v for k, v in r.items() if k != "per_seed_ci"} for m, r in rows.items()}
    assert _held_out_rows(old, lambda m: 0)["dreamgym_grpo"].value == 0.908


def _ci_config_and_model(tmp_path: Path) -> tuple[Config, Path]:
    """The ci profile's config and a stand-in model folder to register."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"\0" * 16)
    return load_config(ROOT / "params.yaml", profile="ci"), model_dir


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_experience_floors_and_ablations_through_the_registry(tmp_path: Path):
    from mlflow import MlflowClient

    from components import model_registry, tracking
    from components.stages.experience import REGISTERED_MODEL, register_experience_model

    cfg, model_dir = _ci_config_and_model(tmp_path)
    floors = tuple(metric for metric, _ in EXPERIENCE_FLOORS)

    def register(reward_acc: float, state_em: float) -> str:
        with tracking.stage_run("train", "experience", cfg, (), tmp_path) as run:
            version = register_experience_model(run, cfg, model_dir, "grounded")
            tags = {
                **metric_tags("reward_accuracy", m(reward_acc, reward_acc - 0.01, reward_acc)),
                **baseline_tags("reward_accuracy", 0.937),
                **_floor_tags("state_exact_match", state_em, 0.043),
                **_floor_tags("state_token_f1", 0.78, 0.73),
            }
            model_registry.tag_model_alias(REGISTERED_MODEL, CANDIDATE, tags)
        return version

    def promote():
        return apply_promotion(tmp_path, REGISTERED_MODEL, "reward_accuracy", 0.02, floors=floors)

    register(0.0, 0.28)  # reward accuracy 0: no champion yet, still refused
    d = promote()
    assert not d.promote and d.reason.startswith("quality floor: reward_accuracy 0.0000")
    assert model_registry.model_version_by_alias(REGISTERED_MODEL, CHAMPION) is None
    register(0.97, 0.01)  # worse than "nothing changes" on the next state
    assert "state_exact_match 0.0100 does not beat" in promote().reason
    v3 = register(0.97, 0.28)
    assert (
        promote().promote
        and model_registry.model_version_by_alias(REGISTERED_MODEL, CHAMPION)[0] == v3
    )

    # an ablation experiment: its own registered model, no alias anywhere, never promoted
    ablation = cfg.model_copy(
        update={"ablation": cfg.ablation.model_copy(update={"no_replay": True})}
    )
    with tracking.stage_run("train", "experience", ablation, (), tmp_path) as run:
        version = register_experience_model(run, ablation, model_dir, "grounded")
    client = MlflowClient()
    mv = client.get_model_version(f"{REGISTERED_MODEL}-ablation", version)
    assert mv.tags["ablation"] == "no_replay" and not mv.aliases
    assert model_registry.model_version_by_alias(REGISTERED_MODEL, CANDIDATE)[0] == v3
    d = apply_promotion(tmp_path, f"{REGISTERED_MODEL}-ablation", "reward_accuracy", 0.02)
    assert not d.promote and "ablation" in d.reason


def _table1(**success: float) -> dict:
    rows = {
        k: {
            "success": v,
            "ci_low": max(0.0, v - 0.05),
            "ci_high": min(1.0, v + 0.05),
            "episodes": 100,
        }
        for k, v in success.items()
    }
    return {"_provenance": {"profile": "ci"}, "textworld": rows}


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_policy_champion_is_the_best_held_out_success_above_random(tmp_path: Path):
    from components import model_registry, tracking

    cfg, model_dir = _ci_config_and_model(tmp_path)
    versions = {}
    for method in ("sft", "dreamgym_grpo"):
        with tracking.stage_run("train", "agent", cfg, (), tmp_path) as run:
            versions[method] = model_registry.register_model_dir(
                run, model_dir, "policy", aliases=(CANDIDATE, method)
            )

    # every method at or below the random policy: refused, no champion
    d = apply_policy_promotion(tmp_path, _table1(random=0.5, sft=0.4, dreamgym_grpo=0.5), 0.02)
    assert (
        not d.promote
        and d.reason == "quality floor: success 0.5000 does not beat its baseline 0.5000"
    )
    assert model_registry.model_version_by_alias("policy", CHAMPION) is None
    assert "no random baseline" in apply_policy_promotion(tmp_path, _table1(sft=0.7), 0.02).reason
    two_envs = {**_table1(random=0.1, sft=0.7), "miniwob": {}}
    assert "expected one environment" in apply_policy_promotion(tmp_path, two_envs, 0.02).reason
    d = apply_policy_promotion(tmp_path, two_envs, 0.02, env="scienceworld")
    assert not d.promote and d.reason.startswith("no scienceworld section")

    # the best held-out success wins (not the last trained candidate, sft)
    d = apply_policy_promotion(tmp_path, _table1(random=0.16, sft=0.70, dreamgym_grpo=0.84), 0.02)
    assert d.promote and d.candidate_version == versions["dreamgym_grpo"]
    assert model_registry.model_version_by_alias("policy", CHAMPION)[0] == versions["dreamgym_grpo"]
    # a lucky-looking sft within the margin does not displace it
    d = apply_policy_promotion(tmp_path, _table1(random=0.16, sft=0.85, dreamgym_grpo=0.84), 0.02)
    assert not d.promote and "below margin" in d.reason
    # a later Table 1 re-evaluates the champion lower: its tag is refreshed, so the best
    # method now is compared with the fresh figure, not the old 0.84
    d = apply_policy_promotion(tmp_path, _table1(random=0.16, sft=0.85, dreamgym_grpo=0.60), 0.02)
    champion_tags = model_registry.model_version_by_alias("policy", CHAMPION)[1]
    assert d.promote and d.candidate_version == versions["sft"], d.reason
    assert metric_from_tags(champion_tags, "success").value == 0.85
    old_champion = model_registry.model_version_by_alias("policy", "dreamgym_grpo")[1]
    assert metric_from_tags(old_champion, "success").value == 0.60
    # an ablation run's Table 1 neither tags the normal run's versions nor promotes one
    tags_before = model_registry.model_version_by_alias("policy", "sft")[1]
    d = apply_policy_promotion(tmp_path, _table1(random=0.1, sft=0.99), 0.02, ablation="no_replay")
    assert not d.promote and d.reason == "an ablation run (no_replay): never promoted"
    assert model_registry.model_version_by_alias("policy", "sft")[1] == tags_before
    assert model_registry.model_version_by_alias("policy", CHAMPION)[0] == versions["sft"]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_promote_command_applies_both_rules_after_a_run(tmp_path: Path):
    from typer.testing import CliRunner

    from components import model_registry, tracking
    from components.cli import app

    cfg, model_dir = _ci_config_and_model(tmp_path)
    with tracking.stage_run("train", "agent", cfg, (), tmp_path) as run:
        version = model_registry.register_model_dir(
            run, model_dir, "policy", aliases=(CANDIDATE, "sft")
        )
    args = ["promote", "--params", str(ROOT / "params.yaml"), "--profile", "ci"]
    args += ["--root", str(tmp_path)]
    missing = CliRunner().invoke(app, args)
    assert missing.exit_code != 0 and "table1.json missing" in missing.output

    (tmp_path / "metrics").mkdir()
    # Table 1 also carries the other envs' merged sections: only the active env's is read
    table1 = _table1(random=0.2, sft=0.7)
    table1["scienceworld"] = _table1(random=0.0, dreamgym_grpo=0.9)["textworld"]
    (tmp_path / "metrics" / "table1.json").write_text(json.dumps(table1))
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.index("{") :])
    assert out["policy"]["promoted"] and out["policy"]["version"] == version
    assert not out["experience_model"]["promoted"]  # none registered: refused with a reason
    assert out["experience_model"]["reason"]
    assert model_registry.model_version_by_alias("policy", CHAMPION)[0] == version
