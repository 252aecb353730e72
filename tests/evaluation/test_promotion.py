"""The promotion rule (pure cases) and its application through MLflow aliases."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import load_config
from components.evaluation.promotion import (
    CANDIDATE,
    CHAMPION,
    HeldOutMetric,
    apply_promotion,
    decide,
    higher_is_better,
    metric_from_tags,
    metric_tags,
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

    from components import tracking

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"\0" * 16)
    name = "policy"

    def register(value: float, low: float, high: float) -> str:
        with tracking.stage_run("evaluate", "agent", cfg, (), tmp_path) as run:
            version = tracking.register_model_dir(run, model_dir, name, aliases=(CANDIDATE,))
            tracking.tag_model_alias(name, CANDIDATE, metric_tags("success", m(value, low, high)))
        return version

    assert apply_promotion(tmp_path, name, "success", 0.02).reason.startswith("no policy@")
    v1 = register(0.30, 0.20, 0.40)
    d1 = apply_promotion(tmp_path, name, "success", 0.02)
    assert d1.promote and d1.candidate_version == v1 and d1.champion_version is None
    assert tracking.model_version_by_alias(name, CHAMPION)[0] == v1
    assert apply_promotion(tmp_path, name, "success", 0.02).reason.startswith("candidate is")

    v2 = register(0.31, 0.21, 0.41)  # +0.01: kept out
    d2 = apply_promotion(tmp_path, name, "success", 0.02)
    assert not d2.promote and tracking.model_version_by_alias(name, CHAMPION)[0] == v1
    tags = MlflowClient().get_model_version(name, v2).tags
    assert tags["promotion.decision"] == "kept champion" and tags["promotion.compared_to"] == v1

    v3 = register(0.50, 0.40, 0.60)
    d3 = apply_promotion(tmp_path, name, "success", 0.02)
    assert d3.promote and d3.champion_version == v1
    assert tracking.model_version_by_alias(name, CHAMPION)[0] == v3
    assert MlflowClient().get_model_version(name, v3).tags["promotion.decision"] == "promoted"
