"""One markdown + PNG summary of a pipeline run, built only from the metrics files.

Reads ``metrics/`` (every file optional): data.json, buffer.json, annotate.json,
experience.json (or experience/<variant>.json), fidelity.json (flat or keyed by variant),
table1.json (``{env: {method: {success, ci_low, ci_high, episodes, seeds, real_steps}}}``),
judge.json (``{variant: {criterion: mean, n}}``), drift.json (per iteration
``{drift_share, drifted}``, optionally grouped per synthetic run), theorem1.json and the RL
curves ``history/<method>.jsonl`` (one row per RL round). A missing file is reported as
"not run", an unreadable one with its error; nothing is ever filled in. Writes
``report.md`` and the PNG plots beside it. Every name in ``PLOTS`` is always written (a
plot without data says "not run" and is not linked), so the DVC stage can list its outputs
file by file; the result returns the real plots (the caller logs them to MLflow).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from components.agent.table1 import LABELS as TABLE1_LABELS
from components.config import ReportConfig
from components.evaluation.judge import CRITERIA, VARIANT_LABELS, VARIANTS

REPORT_NAME = "report.md"
NOT_RUN = "not run"
HISTORY_DIR = "history"  # metrics/history/<method>.jsonl: the RL training curves
# the plots, always written (placeholders without data): the DVC outputs of the stage
SUCCESS_PNG, CURVES_PNG, FIDELITY_PNG = "success.png", "rl_curves.png", "fidelity.png"
JUDGE_PNG, DRIFT_PNG, THEOREM1_PNG = "judge.png", "drift.png", "theorem1.png"
PLOTS = (SUCCESS_PNG, CURVES_PNG, FIDELITY_PNG, JUDGE_PNG, DRIFT_PNG, THEOREM1_PNG)
METRIC_FILES = (
    "data.json",
    "buffer.json",
    "annotate.json",
    "experience.json",
    "fidelity.json",
    "table1.json",
    "judge.json",
    "drift.json",
    "theorem1.json",
)
# Table-1 methods in their order, with their labels (one home: components/agent/table1.py)
METHOD_LABELS = TABLE1_LABELS
ABLATIONS = (*VARIANTS, "no_task_generation")
ABLATION_LABELS = {**VARIANT_LABELS, "no_task_generation": "w/o task generation"}
# DESIGN.md: success % (Llama-3.2-3B / Llama-3.1-8B / Qwen-2.5-7B), for context only
PAPER_TABLE1 = {
    "WebShop": (
        "32.0/35.1/32.9",
        "35.9/31.0/34.8",
        "62.1/65.0/66.1",
        "59.3/63.9/68.3",
        "70.5/75.0/72.1",
    ),
    "ALFWorld": (
        "61.7/68.0/71.8",
        "63.3/63.9/61.1",
        "65.3/70.9/79.8",
        "62.1/66.3/71.0",
        "65.0/75.9/82.4",
    ),
    "WebArena-Lite": (
        "6.1/5.5/7.3",
        "5.5/4.8/4.8",
        "7.3/6.1/6.1",
        "13.3/9.1/12.7",
        "13.9/9.7/11.2",
    ),
}
PAPER_COLUMNS = ("SFT", "DPO", "GRPO real (80K)", "DreamGym GRPO (0 real)", "S2R GRPO (5K)")
# the paper's row next to ours: ALFWorld, whose engine (TextWorld) is our primary env
PAPER_ENV = "ALFWorld"
PAPER_METHOD_COLUMN = {
    "sft": 0,
    "dpo": 1,
    "grpo_real": 2,
    "dreamgym_grpo": 3,
    "s2r_grpo": 4,
}
# DESIGN.md: ablations, Llama-3.1-8B, success % WebShop / WebArena (no w/o history row)
PAPER_ABLATION = {
    "full": "63.9 / 13.3",
    "no_replay": "59.2 / 9.7",
    "no_reasoning": "55.8 / 7.3",
    "no_task_generation": "57.3 / 7.3",
}


@dataclass
class ReportResult:
    """What the report wrote: the markdown, the plots and the status of every input."""

    markdown: Path
    plots: list[Path] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)  # file -> ok / not run / unreadable
    placeholders: list[Path] = field(default_factory=list)  # PLOTS written without data


class _Inputs:
    """The metrics files, each read once: data, or why there is none."""

    def __init__(self, metrics_dir: Path) -> None:
        self.dir = metrics_dir
        self.data: dict[str, Any] = {}
        self.status: dict[str, str] = {}
        for name in METRIC_FILES:
            self._read(name, metrics_dir / name)
        # the experience stage may write one file per variant instead of experience.json
        if "experience.json" not in self.data and (metrics_dir / "experience").is_dir():
            per_variant = {}
            for p in sorted((metrics_dir / "experience").glob("*.json")):
                try:
                    per_variant[p.stem] = json.loads(p.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
            if per_variant:
                self.data["experience.json"] = per_variant
                self.status["experience.json"] = "ok (experience/<variant>.json)"
        self.history = self._read_history(metrics_dir / HISTORY_DIR)

    def _read_history(self, folder: Path) -> dict[str, list[dict[str, Any]]]:
        """``{method: rounds}`` from history/<method>.jsonl (unreadable lines skipped)."""
        curves: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else ():
            rows, bad = [], 0
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line) if line.strip() else None
                except ValueError:
                    row = None
                    bad += 1
                if isinstance(row, dict):
                    rows.append(row)
            name = f"{HISTORY_DIR}/{path.name}"
            self.status[name] = f"ok ({len(rows)} rounds)" + (f", {bad} bad lines" if bad else "")
            if rows:
                curves[path.stem] = rows
        if not curves:
            self.status[f"{HISTORY_DIR}/*.jsonl"] = NOT_RUN
        return curves

    def _read(self, name: str, path: Path) -> None:
        if not path.is_file():
            self.status[name] = NOT_RUN
            return
        try:
            self.data[name] = json.loads(path.read_text(encoding="utf-8"))
            self.status[name] = "ok"
        except (OSError, ValueError) as err:
            self.status[name] = f"unreadable ({type(err).__name__}: {err})"

    def get(self, name: str) -> Any:
        """The parsed file, or None."""
        return self.data.get(name)

    def missing(self, name: str) -> str:
        """The one-line markdown note of a file without data."""
        return f"_{name}: {self.status.get(name, NOT_RUN)}._\n"


# -- formatting --------------------------------------------------------------------------------


def _num(value: Any, digits: int = 3) -> str:
    if value is None or isinstance(value, bool):
        return "n/a" if value is None else str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any, as_percent: bool) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "n/a"
    return f"{value if as_percent else 100 * value:.1f}"


def _method_label(name: str) -> str:
    """``dreamgym_grpo_no_replay`` -> ``DreamGym GRPO w/o replay``."""
    if name in METHOD_LABELS:
        return METHOD_LABELS[name]
    for v in ABLATIONS[1:]:
        if name.endswith("_" + v):
            base = name[: -len(v) - 1]
            return f"{METHOD_LABELS.get(base, base)} {ABLATION_LABELS[v]}"
    return name


def _ci(low: Any, high: Any, fmt: Callable[[Any], str]) -> str:
    return "n/a" if low is None and high is None else f"[{fmt(low)}, {fmt(high)}]"


def _pairs(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_num(v, 2)}" for k, v in sorted(mapping.items()))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _ordered(keys: Sequence[str], order: Sequence[str]) -> list[str]:
    return [k for k in order if k in keys] + sorted(k for k in keys if k not in order)


# -- plots -------------------------------------------------------------------------------------


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


# -- sections ----------------------------------------------------------------------------------


def _inputs_section(inp: _Inputs) -> str:
    names = [*METRIC_FILES, *sorted(n for n in inp.status if n.startswith(HISTORY_DIR + "/"))]
    rows = [[f"`{name}`", inp.status.get(name, NOT_RUN)] for name in names]
    return "## Inputs\n\n" + _table(["metrics file", "status"], rows)


def _data_section(inp: _Inputs) -> str:
    out = ["## Data, buffer, annotation, experience model\n"]
    data = inp.get("data.json")
    if isinstance(data, dict):
        games = data.get("n_games", {})
        rates = data.get("success_rate", {})
        out.append(
            f"- real data: {_num(data.get('n_trajectories'))} trajectories, "
            f"{_num(data.get('n_transitions'))} transitions, games per split "
            f"{', '.join(f'{k} {v}' for k, v in sorted(games.items())) or 'n/a'}; "
            f"collector success {_pairs(rates) or 'n/a'}\n"
        )
    else:
        out.append("- " + inp.missing("data.json"))
    buf = inp.get("buffer.json")
    if isinstance(buf, dict):
        out.append(
            f"- replay buffer: {_num(buf.get('rows'))} rows "
            f"({_num(buf.get('rows_real'))} real, {_num(buf.get('rows_synthetic'))} synthetic), "
            f"retrieval p50 {_num(buf.get('probe_retrieval_p50_ms'), 1)} ms\n"
        )
    else:
        out.append("- " + inp.missing("buffer.json"))
    ann = inp.get("annotate.json")
    if isinstance(ann, dict):
        out.append(
            f"- teacher annotation: {_num(ann.get('n_total_annotated', ann.get('n_annotated')))} "
            f"annotated, {_num(ann.get('n_failed'))} failed, cost ${_num(ann.get('cost_usd'), 2)}\n"
        )
    else:
        out.append("- " + inp.missing("annotate.json"))
    exp = inp.get("experience.json")
    if isinstance(exp, dict):
        variants = exp if all(isinstance(v, dict) for v in exp.values()) else {"full": exp}
        rows = [
            [
                ABLATION_LABELS.get(v, v),
                _num(m.get("train_steps")),
                _num(m.get("train_minutes"), 1),
                _num(m.get("train_loss")),
                _num(m.get("eval_loss")),
            ]
            for v, m in ((v, variants[v]) for v in _ordered(list(variants), ABLATIONS))
        ]
        out.append("\nExperience-model SFT:\n\n")
        out.append(_table(["variant", "steps", "minutes", "train loss", "eval loss"], rows))
    else:
        out.append("- experience model: " + inp.missing("experience.json"))
    return "".join(out)


def _table1_rows(t1: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """``{env: {method: row}}`` with the methods not evaluated (None) left out."""
    if not isinstance(t1, dict):
        return {}
    out = {}
    for env, methods in t1.items():
        rows = (
            {k: v for k, v in methods.items() if isinstance(v, dict)}
            if isinstance(methods, dict)
            else {}
        )
        if rows:
            out[str(env)] = rows
    return out


def _diff(d: Any, with_ci: bool = False) -> str:
    """A paired difference in points (``+5.2 (+1.0, +9.4)``); empty when absent."""
    if not isinstance(d, dict) or not isinstance(d.get("diff"), int | float):
        return ""
    text = f"{100 * d['diff']:+.1f}"
    if with_ci and isinstance(d.get("ci_low"), int | float):
        text += f" ({100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f})"
    return text


def _mean_over_seeds(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per round: the mean of each number over the seeds' rows of that round."""
    by_round: dict[float, list[Mapping[str, Any]]] = {}
    for i, r in enumerate(rows):
        by_round.setdefault(float(r.get("iteration", i + 1)), []).append(r)
    out = []
    for it, group in sorted(by_round.items()):
        keys = {k for r in group for k, v in r.items() if isinstance(v, int | float)}
        row: dict[str, Any] = {"iteration": it, "seeds": len(group)}
        for k in keys - {"iteration", "seed"}:
            vals = [float(r[k]) for r in group if isinstance(r.get(k), int | float)]
            row[k] = sum(vals) / len(vals)
        out.append(row)
    return out


def _paper_cell(method: str) -> str:
    col = PAPER_METHOD_COLUMN.get(method)
    return "" if col is None else PAPER_TABLE1[PAPER_ENV][col]


def _table1_section(inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path]) -> str:
    out = ["## Table 1 analogue: success on held-out real tasks\n\n"]
    t1 = _table1_rows(inp.get("table1.json"))
    labels: list[str] = []
    heights: list[float | None] = []
    errors: list[tuple[float, float] | None] = []
    if not t1:
        note = inp.missing("table1.json")
        if inp.status.get("table1.json") == "ok":
            note = "_table1.json: no method evaluated yet._\n"
        out.append(note)
    header = [
        "method",
        "success %",
        "95% CI",
        "greedy %",
        "vs SFT (95% CI)",
        "vs random",
        "episodes",
        "seeds",
        "real env steps",
    ]
    if cfg.paper_reference:
        header.append(f"paper {PAPER_ENV} % (3B/8B/7B)")
    for env in sorted(t1):
        methods = t1[env]
        values = [m.get("success") for m in methods.values()]
        as_percent = any(isinstance(v, int | float) and v > 1 for v in values)
        pct = partial(_pct, as_percent=as_percent)
        scale = 1.0 if as_percent else 100.0
        rows = []
        for name in _ordered(list(methods), list(METHOD_LABELS)):
            m = methods[name]
            rows.append(
                [
                    _method_label(name),
                    pct(m.get("success")),
                    _ci(m.get("ci_low"), m.get("ci_high"), pct),
                    pct((m.get("greedy") or {}).get("success")),
                    _diff(m.get("vs_sft"), with_ci=True),
                    _diff(m.get("vs_random")),
                    _num(m.get("episodes")),
                    _num(m.get("seeds")),
                    _num(m.get("real_steps")),
                ]
                + ([_paper_cell(name)] if cfg.paper_reference else [])
            )
            prefix = f"{env}: " if len(t1) > 1 else ""
            labels.append(prefix + _method_label(name))
            succ, lo, hi = m.get("success"), m.get("ci_low"), m.get("ci_high")
            heights.append(scale * succ if isinstance(succ, int | float) else None)
            bounds = isinstance(lo, int | float) and isinstance(hi, int | float)
            errors.append((scale * lo, scale * hi) if bounds else None)
        out.append(f"### {env}\n\n")
        out.append(_table(header, rows))
    png = _bar_plot(
        out_dir / SUCCESS_PNG,
        "Success on held-out real tasks",
        labels,
        {"success %": heights},
        cfg.dpi,
        "success %",
        errors=errors,
    )
    if png is not None:
        plots.append(png)
        out.append(f"\n![success on held-out tasks]({png.name})\n\n")
    if cfg.paper_reference:
        out.append(
            f"\nThe paper column is its {PAPER_ENV} row (ALFWorld runs on TextWorld, our "
            "primary env); the paper's full table for context (success %, Llama-3.2-3B / "
            "Llama-3.1-8B / Qwen-2.5-7B; different environments and models, not measured "
            "here):\n\n"
        )
        out.append(_table(["env", *PAPER_COLUMNS], [[e, *v] for e, v in PAPER_TABLE1.items()]))
    return "".join(out)


def _final(rows: Sequence[Mapping[str, Any]], key: str, k: int = 3) -> float | None:
    """Mean of ``key`` over the last ``k`` rounds that have it (one round is noisy)."""
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)][-k:]
    return sum(values) / len(values) if values else None


def _curves_section(inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path]) -> str:
    out = ["## RL training curves (success rate of each round's rollouts)\n\n"]
    curves = {name: _mean_over_seeds(rows) for name, rows in inp.history.items()}
    if not curves:
        return out[0] + f"_{HISTORY_DIR}/*.jsonl: {NOT_RUN}._\n"
    names = _ordered(list(curves), list(METHOD_LABELS))
    rows = []
    for name in names:
        hist = curves[name]
        first = next((r["success_rate"] for r in hist if "success_rate" in r), None)
        real = _final(hist, "real_steps", k=1)
        seconds = sum(
            float(r.get(k, 0) or 0) for r in hist for k in ("rollout_seconds", "update_seconds")
        )
        rows.append(
            [
                _method_label(name),
                _num(len(hist)),
                _num(first, 2),
                _num(_final(hist, "success_rate"), 2),
                _num(None if real is None else int(real)),
                _num(seconds / 60, 1),
            ]
        )
    header = [
        "method",
        "rounds",
        "first round",
        "last 3 rounds",
        "real env steps (per seed)",
        "minutes (per seed)",
    ]
    out.append(_table(header, rows))
    out.append(
        "\nRollout success is measured in the env each method trains in: the synthetic env "
        "for DreamGym, the real one for the baselines and S2R; each round is the mean over "
        "the training seeds.\n"
    )
    png = _curve_plot(out_dir / CURVES_PNG, {n: curves[n] for n in names}, cfg.dpi)
    if png is not None:
        plots.append(png)
        out.append(f"\n![RL curves]({png.name})\n")
    return "".join(out)


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


def _fidelity_variants(fid: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(fid, dict):
        return {}
    if "eps_R" in fid:  # an older flat file: the full model only
        return {"full": fid}
    return {k: v for k, v in fid.items() if isinstance(v, dict)}


def _fidelity_section(inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path]) -> str:
    out = ["## Experience-model fidelity (held-out real transitions)\n\n"]
    variants = _fidelity_variants(inp.get("fidelity.json"))
    if not variants:
        return out[0] + inp.missing("fidelity.json")
    names = _ordered(list(variants), ABLATIONS)
    rows = []
    for v in names:
        m = variants[v]
        ci = _ci(m.get("eps_R_ci95_low"), m.get("eps_R_ci95_high"), _num)
        rows.append(
            [
                ABLATION_LABELS.get(v, v),
                _num(m.get("n")),
                _num(m.get("eps_R")),
                ci,
                _num(m.get("state_exact_match")),
                _num(m.get("state_token_f1")),
                _num(m.get("malformed_rate")),
                _num(m.get("copy_baseline_state_token_f1")),
            ]
        )
    header = ["variant", "n", "eps_R", "95% CI", "state EM", "state F1", "malformed", "copy F1"]
    out.append(_table(header, rows))
    out.append("\neps_R: share of wrong rewards (malformed answers count as wrong).\n")
    png = _bar_plot(
        out_dir / FIDELITY_PNG,
        "Experience-model fidelity by variant",
        [ABLATION_LABELS.get(v, v) for v in names],
        {
            "eps_R (lower is better)": [variants[v].get("eps_R") for v in names],
            "state token F1": [variants[v].get("state_token_f1") for v in names],
            "malformed rate": [variants[v].get("malformed_rate") for v in names],
        },
        cfg.dpi,
        "rate",
    )
    if png is not None:
        plots.append(png)
        out.append(f"\n![fidelity]({png.name})\n")
    return "".join(out)


def _judge_section(inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path]) -> str:
    out = ["## Judge of synthetic trajectories (0-2, higher is better)\n\n"]
    judge = inp.get("judge.json")
    variants = (
        {k: v for k, v in judge.items() if isinstance(v, dict)} if isinstance(judge, dict) else {}
    )
    if not variants:
        return out[0] + inp.missing("judge.json")
    names = _ordered(list(variants), ABLATIONS)
    rows = [
        [ABLATION_LABELS.get(v, v), _num(variants[v].get("n"))]
        + [_num(variants[v].get(c), 2) for c in CRITERIA]
        + [
            f"{_num(variants[v].get('n_without_transition'))} / "
            f"{_num(variants[v].get('n_episodes'))}",
            _num(variants[v].get("malformed_rate")),
        ]
        for v in names
    ]
    header = ["variant", "n", *CRITERIA, "episodes without a transition", "malformed"]
    out.append(_table(header, rows))
    out.append(
        "\nhallucination 2 = none found. n counts the judged synthetic trajectories; an "
        "episode whose first answer is malformed twice has no transition to judge.\n"
    )
    png = _bar_plot(
        out_dir / JUDGE_PNG,
        "Judge scores of synthetic trajectories",
        [ABLATION_LABELS.get(v, v) for v in names],
        {c: [variants[v].get(c) for v in names] for c in CRITERIA},
        cfg.dpi,
        "score (0-2)",
    )
    if png is not None:
        plots.append(png)
        out.append(f"\n![judge]({png.name})\n")
    return "".join(out)


def _ablation_section(inp: _Inputs) -> str:
    fid = _fidelity_variants(inp.get("fidelity.json"))
    judge = inp.get("judge.json") if isinstance(inp.get("judge.json"), dict) else {}
    success: dict[str, float] = {}
    t1 = inp.get("table1.json")
    if isinstance(t1, dict) and t1:
        # one number per variant: the primary env (textworld) when present, else the first
        env = "textworld" if "textworld" in t1 else sorted(t1)[0]
        methods = t1[env] if isinstance(t1[env], dict) else {}
        for name, m in methods.items():
            if not isinstance(m, dict) or "success" not in m:
                continue
            for v in ABLATIONS[1:]:
                if name.endswith("_" + v):
                    success[v] = m["success"]
            if name == "dreamgym_grpo":
                success.setdefault("full", m["success"])
    present = [v for v in ABLATIONS if v in fid or v in judge or v in success]
    head = "## Ablations\n\n"
    if not present:
        return (
            head + "_no ablation variant in fidelity.json, judge.json or table1.json: not run._\n"
        )
    as_percent = any(v > 1 for v in success.values())
    rows = [
        [
            ABLATION_LABELS.get(v, v),
            _pct(success.get(v), as_percent),
            _num(fid.get(v, {}).get("eps_R")),
            _num(fid.get(v, {}).get("state_token_f1")),
            _num(judge.get(v, {}).get("consistency"), 2),
            _num(judge.get(v, {}).get("hallucination"), 2),
            PAPER_ABLATION.get(v, "n/a"),
        ]
        for v in present
    ]
    header = [
        "variant",
        "success %",
        "eps_R",
        "state F1",
        "judge consistency",
        "judge halluc.",
        "paper success % (WebShop / WebArena)",
    ]
    note = (
        "\nRun an ablation as a DVC experiment (`dvc exp run -S ablation.no_replay=true`) "
        "and compare with `dvc exp show`; the paper column is Llama-3.1-8B.\n"
    )
    return head + _table(header, rows) + note


def _drift_rows(drift: Any, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Iteration rows; ``{run: {iter_k: row}}`` (one group per synthetic run) flattened."""
    if not isinstance(drift, dict):
        return {}
    body = drift.get("iterations", drift)
    if not isinstance(body, dict):
        return {}
    rows: dict[str, dict[str, Any]] = {}
    for key, value in body.items():
        if not isinstance(value, dict):
            continue
        if "drift_share" in value:
            rows[f"{prefix}{key}"] = value
        else:
            rows.update(_drift_rows(value, f"{prefix}{key} "))
    return rows


def _drift_section(
    inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path], threshold: float | None
) -> str:
    out = ["## Drift of synthetic from real transitions (Evidently)\n\n"]
    rows = _drift_rows(inp.get("drift.json"))
    if not rows:
        return out[0] + inp.missing("drift.json")
    keys = sorted(rows, key=_iteration_key)
    table = [
        [
            k,
            _num(rows[k].get("drift_share"), 2),
            _num(rows[k].get("drifted")),
            _num(rows[k].get("n_drifted")),
            _num(rows[k].get("n_transitions")),
        ]
        for k in keys
    ]
    out.append(_table(["iteration", "drift share", "drifted", "drifted features", "n"], table))
    flagged = [k for k in keys if rows[k].get("drifted")]
    out.append(
        f"\n**Drift flagged** in {', '.join(flagged)}.\n" if flagged else "\nNo drift flagged.\n"
    )
    png = _bar_plot(
        out_dir / DRIFT_PNG,
        "Share of drifted features per iteration",
        keys,
        {"drift share": [rows[k].get("drift_share") for k in keys]},
        cfg.dpi,
        "share of features",
        hline=threshold,
    )
    if png is not None:
        plots.append(png)
        out.append(f"\n![drift]({png.name})\n")
    return "".join(out)


def _theorem1_section(inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path]) -> str:
    from components.evaluation.theorem1 import IterationTerms, plot_runs

    out = ["## Theorem 1 terms per RL iteration\n\n"]
    doc = inp.get("theorem1.json")
    # {"runs": {method: summary}} from the theorem1 stage; a bare summary is one run
    runs = doc.get("runs") if isinstance(doc, dict) and "runs" in doc else {"": doc}
    runs = {m: r for m, r in runs.items() if isinstance(r, dict) and "iterations" in r}
    if not runs:
        return out[0] + inp.missing("theorem1.json")
    if doc.get("formula"):
        out.append(f"`{doc['formula']}`\n\n")
    cols = ["iteration", "surrogate_gain", "kl", "eps_R", "eps_P", "bound", "real_gain", "holds"]
    fields = IterationTerms.__dataclass_fields__
    records: dict[str, list[IterationTerms]] = {}
    for method, run in runs.items():
        if not run["iterations"]:  # said, not hidden: e.g. every synthetic answer malformed
            out.append(
                f"\n**{method or 'run'}**: {run.get('rounds', 0)} rounds, no update measured "
                "(no synthetic transition of a later round could be replayed).\n"
            )
            continue
        if method:
            out.append(f"\n**{method}**")
            if run.get("real_episodes_per_policy"):
                out.append(
                    f" (real gains on {run['real_episodes_per_policy']} {run.get('real_split')}"
                    " episodes per policy)"
                )
            out.append(
                f": the bound held in {run.get('n_bound_holds')} of "
                f"{run.get('n_with_real_gain')} updates with a measured real gain.\n\n"
            )
        its = run["iterations"]
        out.append(_table(cols, [[_num(r.get(c)) for c in cols] for r in its]))
        try:
            records[method] = [
                IterationTerms(**{k: v for k, v in r.items() if k in fields}) for r in its
            ]
        except (TypeError, ValueError) as err:
            out.append(f"\n_plot of {method or 'the run'} skipped: {err}_\n")
    png = plot_runs(records, out_dir / THEOREM1_PNG, cfg.dpi) if records else None
    if png is not None:
        plots.append(png)
        out.append(f"\n![theorem 1]({png.name})\n")
    real = {m: r["real_success"] for m, r in runs.items() if r.get("real_success")}
    for method, by_round in real.items():
        ordered = sorted(by_round.items(), key=lambda kv: int(kv[0]))  # JSON keys are text
        rates = ", ".join(f"pi_{k} {_num(v)}" for k, v in ordered)
        out.append(f"\nReal {runs[method].get('real_split')} success of {method}: {rates}.\n")
    return "".join(out)


def _iteration_key(key: str) -> tuple[str, int, str]:
    run, _, it = key.rpartition(" ")
    digits = "".join(ch for ch in it if ch.isdigit())
    return (run, int(digits) if digits else 1 << 30, key)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text.lower()).strip("_") or "env"


def build_report(
    metrics_dir: Path,
    out_dir: Path,
    cfg: ReportConfig,
    *,
    drift_threshold: float | None = None,
) -> ReportResult:
    """Write ``out_dir/report.md`` and its PNG plots from the metrics files; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    inp = _Inputs(metrics_dir)
    plots: list[Path] = []
    sections: list[Callable[[], str]] = [
        lambda: _inputs_section(inp),
        lambda: _table1_section(inp, out_dir, cfg, plots),
        lambda: _curves_section(inp, out_dir, cfg, plots),
        lambda: _ablation_section(inp),
        lambda: _fidelity_section(inp, out_dir, cfg, plots),
        lambda: _judge_section(inp, out_dir, cfg, plots),
        lambda: _drift_section(inp, out_dir, cfg, plots, drift_threshold),
        lambda: _theorem1_section(inp, out_dir, cfg, plots),
        lambda: _data_section(inp),
    ]
    parts = [f"# {cfg.title}\n"]
    for section in sections:
        parts.append(section())
    if _pyplot() is None:
        parts.append("\n_matplotlib is not installed: plots skipped._\n")
    md = out_dir / REPORT_NAME
    md.write_text("\n".join(parts), encoding="utf-8")
    made = {p.name for p in plots}
    placeholders = [
        png
        for name in PLOTS
        if name not in made
        and (png := _placeholder(out_dir / name, f"{name[:-4]}: {NOT_RUN}", cfg.dpi))
    ]
    return ReportResult(md, plots, dict(inp.status), placeholders)
