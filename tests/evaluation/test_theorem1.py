"""Theorem-1 terms: the bound's arithmetic, the KL estimate, model errors, JSON + plot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from components.evaluation.theorem1 import (
    IterationTerms,
    bound_terms,
    kl_estimate,
    load_records,
    model_errors,
    summarize,
    write_theorem1,
)


def test_bound_subtracts_the_trust_region_and_model_error_terms():
    t = IterationTerms(
        iteration=1,
        surrogate_gain=0.2,
        kl=0.001,
        eps_R=0.05,
        eps_P=0.01,
        horizon=5,
        real_gain=0.15,
    )
    row = bound_terms(t)
    assert row["kl_penalty"] == pytest.approx(4 * 25 * 0.001)
    assert row["model_error"] == pytest.approx(2 * (5 * 0.05 + 25 * 0.01))
    assert row["bound"] == pytest.approx(0.2 - 0.1 - 1.0)
    assert row["holds"] is True and row["slack"] == pytest.approx(0.15 - row["bound"])
    # a perfect model and no policy change: the bound is the surrogate gain itself
    exact = bound_terms(IterationTerms(2, 0.3, 0.0, 0.0, 0.0, horizon=10, real_gain=0.1))
    assert exact["bound"] == 0.3 and exact["holds"] is False
    assert bound_terms(IterationTerms(3, 0.1, 0.0, 0.0, 0.0, horizon=1))["holds"] is None


@pytest.mark.parametrize(
    "kwargs",
    [{"kl": -0.1}, {"eps_R": 1.5}, {"eps_P": -0.1}, {"horizon": 0.5}],
)
def test_invalid_terms_are_rejected(kwargs):
    base = {
        "iteration": 0,
        "surrogate_gain": 0.0,
        "kl": 0.0,
        "eps_R": 0.0,
        "eps_P": 0.0,
        "horizon": 3,
    }
    with pytest.raises(ValueError):
        IterationTerms(**{**base, **kwargs})


def test_kl_estimate_is_zero_for_the_same_policy_and_positive_otherwise():
    rng = np.random.default_rng(0)
    logp = np.log(rng.uniform(0.05, 1.0, size=200))
    assert kl_estimate(logp, logp) == 0.0
    assert kl_estimate(logp, logp - 0.3) > 0
    assert kl_estimate([], []) == 0.0
    # Bernoulli(0.6) vs Bernoulli(0.5), sampled from the new policy: the k3 estimate of KL
    p, q = 0.6, 0.5
    x = rng.random(200_000) < p
    new = np.where(x, math.log(p), math.log(1 - p))
    old = np.where(x, math.log(q), math.log(1 - q))
    true_kl = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    assert kl_estimate(new, old) == pytest.approx(true_kl, rel=0.05)
    with pytest.raises(ValueError):
        kl_estimate([0.0, 1.0], [0.0])


def test_model_errors_from_replayed_transitions():
    rows = [
        {"replayed": True, "reward_match": True, "state_em": True, "state_f1": 1.0},
        {"replayed": True, "reward_match": False, "state_em": False, "state_f1": 0.5},
        {"replayed": False, "after_real_end": True},
        {"replayed": False, "error": "env error"},
    ]
    e = model_errors(rows)
    assert e["n"] == 2 and e["eps_R"] == 0.5
    assert e["eps_P"] == pytest.approx(2 / 3) and e["eps_P_f1"] == pytest.approx(1.5 / 3)
    assert model_errors([])["eps_R"] is None


def test_json_and_plot_round_trip(tmp_path):
    records = [
        IterationTerms(
            i,
            surrogate_gain=0.1 * i,
            kl=0.002,
            eps_R=0.1,
            eps_P=0.4,
            horizon=6,
            real_gain=0.05 * i if i else None,
            eps_P_f1=0.2,
        )
        for i in (2, 0, 1)
    ]
    json_path, png = write_theorem1(records, tmp_path, dpi=50)
    doc = json.loads(json_path.read_text())
    assert [r["iteration"] for r in doc["iterations"]] == [0, 1, 2]
    assert doc["n_iterations"] == 3 and doc["n_with_real_gain"] == 2
    assert doc["n_bound_holds"] == 2 and "H^2" in doc["formula"]
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["plot"] == png.name
    assert sorted(load_records(json_path), key=lambda r: r.iteration) == sorted(
        records, key=lambda r: r.iteration
    )
    assert summarize([])["n_iterations"] == 0
