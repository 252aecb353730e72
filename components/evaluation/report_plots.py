"""The report's matplotlib figures (PNG files only; None where matplotlib is missing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.evaluation.report_format import _method_label

# the plots, always written (placeholders without data): the DVC outputs of the stage
SUCCESS_PNG, CURVES_PNG, FIDELITY_PNG = "success.png", "rl_curves.png", "fidelity.png"
JUDGE_PNG, DRIFT_PNG, THEOREM1_PNG = "judge.png", "drift.png", "theorem1.png"
PLOTS = (SUCCESS_PNG, CURVES_PNG, FIDELITY_PNG, JUDGE_PNG, DRIFT_PNG, THEOREM1_PNG)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a display
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(plt: Any, fig: Any, path: Path, dpi: int) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _link(png: Path | None, alt: str, plots: list[Path], end: str = "\n") -> str:
    """The markdown image of a written plot, recorded in ``plots``; empty without one."""
    if png is None:
        return ""
    plots.append(png)
    return f"\n![{alt}]({png.name}){end}"


def _placeholder(path: Path, note: str, dpi: int) -> Path | None:
    """A plot that says why it has no data (DVC expects every listed output)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, note, ha="center", va="center", fontsize=10)
    return _save(plt, fig, path, dpi)


def _bar_plot(
    path: Path,
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    dpi: int,
    ylabel: str,
    errors: Sequence[tuple[float, float] | None] | None = None,
    hline: float | None = None,
) -> Path | None:
    plt = _pyplot()
    if plt is None or not labels:
        return None
    import numpy as np

    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels) + 2), 4))
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        heights = [np.nan if v is None else v for v in values]
        yerr = None
        if errors is not None and len(series) == 1:
            lo = [
                0 if e is None or h != h else max(0.0, h - e[0])
                for e, h in zip(errors, heights, strict=True)
            ]
            hi = [
                0 if e is None or h != h else max(0.0, e[1] - h)
                for e, h in zip(errors, heights, strict=True)
            ]
            yerr = [lo, hi]
        ax.bar(
            x + (i - (len(series) - 1) / 2) * width,
            heights,
            width,
            yerr=yerr,
            capsize=3,
            label=name,
        )
    if hline is not None:
        ax.axhline(hline, color="red", ls="--", lw=1, label="threshold")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1 or hline is not None:
        ax.legend(fontsize=8)
    return _save(plt, fig, path, dpi)


def _curve_plot(path: Path, curves: Mapping[str, Sequence[Mapping[str, Any]]], dpi: int) -> Any:
    plt = _pyplot()
    if plt is None:
        return None
    fig, (by_round, by_real) = plt.subplots(1, 2, figsize=(10, 4))
    any_real = False
    for name, rows in curves.items():
        pts = [
            (float(r.get("iteration", i + 1)), float(r["success_rate"]), r.get("real_steps"))
            for i, r in enumerate(rows)
            if isinstance(r.get("success_rate"), int | float)
        ]
        if not pts:
            continue
        label = _method_label(name)
        by_round.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
        real = [(float(p[2]), p[1]) for p in pts if isinstance(p[2], int | float) and p[2] > 0]
        if real:
            any_real = True
            by_real.plot([x for x, _ in real], [y for _, y in real], marker=".", label=label)
    by_round.set(xlabel="RL round", ylabel="rollout success rate", title="Per round")
    by_round.legend(fontsize=7)
    by_real.set(xlabel="real env steps used", ylabel="rollout success rate")
    by_real.set_title("Against the real-interaction budget")
    if any_real:
        by_real.legend(fontsize=7)
    else:
        note = "no method used real steps"
        by_real.text(0.5, 0.5, note, ha="center", transform=by_real.transAxes)
    return _save(plt, fig, path, dpi)
