"""Theorem 1 of DreamGym, measured: per RL iteration, every term of the improvement bound.

The paper bounds the real improvement of a policy trained in the synthetic environment:

    real gain  >=  synthetic surrogate gain  -  trust-region KL penalty  -  model-error term

with the model error growing with eps_R (how often the synthetic reward differs from the
real one) and eps_P (total-variation distance of synthetic from real transitions). The
paper only argues it; here every term is measured, because the real environments can
replay any synthetic (state, action).

Our instantiation (episodic tasks, outcome reward in [0, 1], effective horizon H = the mean
episode length, the discount's 1/(1-gamma) replaced by H):

    kl_penalty  = 4 * H^2 * KL            TRPO's C * D_KL with |advantage| <= 1
    model_error = 2 * (H * eps_R + H^2 * eps_P)
                                          simulation lemma for pi_k and pi_{k-1}
    bound       = surrogate_gain - kl_penalty - model_error

- surrogate gain: J_syn(pi_k) - J_syn(pi_{k-1}), success rates in the synthetic env;
- KL: mean per-token KL(pi_k || pi_{k-1}) on the states pi_k visits (``kl_estimate``);
- eps_R, eps_P: from replaying pi_k's synthetic transitions in the real env
  (``model_errors`` over the grounded judge's transition rows). eps_P is the strict
  deterministic TV (1 - exact next-state match); ``eps_P_f1`` (1 - token F1) is reported
  beside it as the softer reading the paper argues matters;
- real gain: J_real(pi_k) - J_real(pi_{k-1}) on held-out real tasks.

With text states eps_P is large, so the bound is usually vacuous (far below the realised
gain): the plot shows by how much, which is the point of measuring it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components.io import read_json

FORMULA = (
    "bound = surrogate_gain - 4*H^2*KL - 2*(H*eps_R + H^2*eps_P); "
    "H = mean episode length, rewards in [0, 1]"
)
JSON_NAME = "theorem1.json"
PNG_NAME = "theorem1.png"


@dataclass(frozen=True)
class IterationTerms:
    """The measured terms of one RL iteration (pi_{k-1} -> pi_k)."""

    iteration: int
    surrogate_gain: float
    kl: float
    eps_R: float
    eps_P: float
    horizon: float
    real_gain: float | None = None
    eps_P_f1: float | None = None

    def __post_init__(self) -> None:
        if self.kl < 0 or not 0 <= self.eps_R <= 1 or not 0 <= self.eps_P <= 1:
            raise ValueError("kl must be >= 0 and eps_R, eps_P within [0, 1]")
        if self.horizon < 1:
            raise ValueError("horizon must be >= 1 step")


def kl_penalty(kl: float, horizon: float) -> float:
    """TRPO's trust-region penalty 4 H^2 KL (|advantage| <= 1, 1/(1-gamma) -> H)."""
    return 4.0 * horizon**2 * kl


def model_error(eps_r: float, eps_p: float, horizon: float) -> float:
    """Simulation-lemma error for both policies: 2 (H eps_R + H^2 eps_P)."""
    return 2.0 * (horizon * eps_r + horizon**2 * eps_p)


def bound_terms(t: IterationTerms) -> dict[str, Any]:
    """The record with its penalties, the bound and whether the real gain respects it."""
    kl_pen = kl_penalty(t.kl, t.horizon)
    err = model_error(t.eps_R, t.eps_P, t.horizon)
    bound = t.surrogate_gain - kl_pen - err
    out = asdict(t)
    out.update({"kl_penalty": kl_pen, "model_error": err, "bound": bound})
    out["slack"] = None if t.real_gain is None else t.real_gain - bound
    out["holds"] = None if t.real_gain is None else t.real_gain >= bound
    return out


def kl_estimate(logp_new: Sequence[float], logp_old: Sequence[float]) -> float:
    """Mean KL(new || old) from tokens sampled by the new policy (Schulman's k3, >= 0)."""
    new = np.asarray(logp_new, dtype=np.float64)
    old = np.asarray(logp_old, dtype=np.float64)
    if new.shape != old.shape:
        raise ValueError(f"shapes differ: {new.shape} vs {old.shape}")
    if new.size == 0:
        return 0.0
    log_ratio = old - new
    return float(np.mean(np.expm1(log_ratio) - log_ratio))


def model_errors(transitions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """eps_R, eps_P (and the F1 reading) from the grounded judge's replayed transitions.

    A step the synthetic world took after the real episode had ended counts as a
    transition error (TV 1) but not as a reward error (the real reward is undefined).
    """
    rows = list(transitions)
    replayed = [r for r in rows if r.get("replayed")]
    after_end = [r for r in rows if r.get("after_real_end")]
    n_p = len(replayed) + len(after_end)
    if not replayed:
        return {"n": 0, "eps_R": None, "eps_P": None, "eps_P_f1": None}
    eps_r = sum(not r["reward_match"] for r in replayed) / len(replayed)
    em_errors = sum(not r["state_em"] for r in replayed) + len(after_end)
    f1_errors = sum(1.0 - r["state_f1"] for r in replayed) + len(after_end)
    return {
        "n": len(replayed),
        "n_after_real_end": len(after_end),
        "eps_R": eps_r,
        "eps_P": em_errors / n_p,
        "eps_P_f1": f1_errors / n_p,
    }


def summarize(records: Sequence[IterationTerms]) -> dict[str, Any]:
    """The JSON document: per-iteration terms, the formula and how often the bound held."""
    rows = [bound_terms(r) for r in sorted(records, key=lambda r: r.iteration)]
    judged = [r for r in rows if r["holds"] is not None]
    return {
        "formula": FORMULA,
        "n_iterations": len(rows),
        "n_with_real_gain": len(judged),
        "n_bound_holds": sum(r["holds"] for r in judged),
        "iterations": rows,
    }


def plot_theorem1(records: Sequence[IterationTerms], path: Path, dpi: int = 100) -> Path | None:
    """Gains, bound and penalty terms per iteration in one PNG; None without matplotlib."""
    return plot_runs({"": records}, path, dpi)


def plot_runs(
    runs: Mapping[str, Sequence[IterationTerms]], path: Path, dpi: int = 100
) -> Path | None:
    """One column per run (gains + bound above, the terms on a log scale below), one PNG.

    None without matplotlib or without any iteration to plot.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a display
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    docs = {name: summarize(recs)["iterations"] for name, recs in runs.items()}
    docs = {name: rows for name, rows in docs.items() if rows}
    if not docs:
        return None
    fig, axes = plt.subplots(
        2, len(docs), figsize=(6.5 * len(docs), 6), sharex="col", squeeze=False
    )
    for col, (name, rows) in enumerate(docs.items()):
        _plot_column(axes[0][col], axes[1][col], rows, name)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _plot_column(top: Any, bottom: Any, rows: Sequence[Mapping[str, Any]], name: str) -> None:
    its = [r["iteration"] for r in rows]
    top.plot(its, [r["surrogate_gain"] for r in rows], "o-", label="synthetic surrogate gain")
    real = [
        (i, r["real_gain"]) for i, r in zip(its, rows, strict=True) if r["real_gain"] is not None
    ]
    if real:
        top.plot(*zip(*real, strict=True), "s-", label="realised real gain")
    top.plot(its, [r["bound"] for r in rows], "v--", label="Theorem-1 lower bound")
    top.axhline(0.0, color="grey", lw=0.5)
    top.set_ylabel("success-rate gain")
    top.legend(fontsize=8)
    top.set_title(f"Theorem 1 per RL iteration{': ' + name if name else ''}")
    for key, label in (
        ("kl_penalty", "KL penalty 4H²KL"),
        ("model_error", "model error 2(Hε_R+H²ε_P)"),
    ):
        bottom.plot(its, [max(r[key], 1e-12) for r in rows], "o-", label=label)
    bottom.plot(its, [max(r["eps_R"], 1e-12) for r in rows], "x:", label="ε_R")
    bottom.plot(its, [max(r["eps_P"], 1e-12) for r in rows], "x:", label="ε_P")
    bottom.plot(its, [max(r["kl"], 1e-12) for r in rows], "+:", label="KL")
    bottom.set_yscale("log")
    bottom.set_xlabel("RL iteration")
    bottom.set_ylabel("term (log)")
    bottom.legend(fontsize=8)


def write_theorem1(
    records: Sequence[IterationTerms], out_dir: Path, dpi: int = 100
) -> tuple[Path, Path | None]:
    """Write theorem1.json (+ theorem1.png when matplotlib is installed) under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = summarize(records)
    png = plot_theorem1(records, out_dir / PNG_NAME, dpi)
    doc["plot"] = None if png is None else png.name
    if png is None:
        doc["plot_note"] = "matplotlib not installed: no plot"
    path = out_dir / JSON_NAME
    path.write_text(json.dumps(_finite(doc), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path, png


def load_records(path: Path) -> list[IterationTerms]:
    """The per-iteration records back from a theorem1.json."""
    doc = read_json(path)
    fields = IterationTerms.__dataclass_fields__
    return [
        IterationTerms(**{k: v for k, v in row.items() if k in fields}) for row in doc["iterations"]
    ]


def _finite(data: Any) -> Any:
    """NaN/inf become None: JSON has no such numbers."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data
