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

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components.config import ReportConfig
from components.evaluation.report_agents import (
    PAPER_ABLATION,
    PAPER_COLUMNS,
    PAPER_ENV,
    PAPER_METHOD_COLUMN,
    PAPER_TABLE1,
    _ablation_section,
    _curves_section,
    _mean_over_seeds,
    _table1_section,
)
from components.evaluation.report_experience import (
    _data_section,
    _drift_section,
    _fidelity_section,
    _inputs_section,
    _judge_section,
    _theorem1_section,
)
from components.evaluation.report_format import ABLATION_LABELS, ABLATIONS, METHOD_LABELS
from components.evaluation.report_inputs import HISTORY_DIR, METRIC_FILES, NOT_RUN, _Inputs
from components.evaluation.report_plots import (
    CURVES_PNG,
    DRIFT_PNG,
    FIDELITY_PNG,
    JUDGE_PNG,
    PLOTS,
    SUCCESS_PNG,
    THEOREM1_PNG,
    _placeholder,
    _pyplot,
)

# the report's pieces live in the modules below; re-exported so callers import them from here
from components.io import atomic_write_text

__all__ = [
    "ABLATIONS",
    "ABLATION_LABELS",
    "CURVES_PNG",
    "DRIFT_PNG",
    "FIDELITY_PNG",
    "HISTORY_DIR",
    "JUDGE_PNG",
    "METHOD_LABELS",
    "METRIC_FILES",
    "NOT_RUN",
    "PAPER_ABLATION",
    "PAPER_COLUMNS",
    "PAPER_ENV",
    "PAPER_METHOD_COLUMN",
    "PAPER_TABLE1",
    "PLOTS",
    "REPORT_NAME",
    "SUCCESS_PNG",
    "THEOREM1_PNG",
    "ReportResult",
    "_mean_over_seeds",
    "build_report",
]

REPORT_NAME = "report.md"


@dataclass
class ReportResult:
    """What the report wrote: the markdown, the plots and the status of every input."""

    markdown: Path
    plots: list[Path] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)  # file -> ok / not run / unreadable
    placeholders: list[Path] = field(default_factory=list)  # PLOTS written without data


def build_report(
    metrics_dir: Path,
    out_dir: Path,
    cfg: ReportConfig,
    *,
    drift_threshold: float | None = None,
    env: str | None = None,
) -> ReportResult:
    """Write ``out_dir/report.md`` and its PNG plots from the metrics files; their paths.

    ``env`` is the run's env: the ablation rows' success comes from its Table 1 block
    (table1.json may hold other envs' archived rows beside it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    inp = _Inputs(metrics_dir)
    plots: list[Path] = []
    sections: list[Callable[[], str]] = [
        lambda: _inputs_section(inp),
        lambda: _table1_section(inp, out_dir, cfg, plots),
        lambda: _curves_section(inp, out_dir, cfg, plots),
        lambda: _ablation_section(inp, env),
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
    atomic_write_text(md, "\n".join(parts))
    made = {p.name for p in plots}
    placeholders = [
        png
        for name in PLOTS
        if name not in made
        and (png := _placeholder(out_dir / name, f"{name[:-4]}: {NOT_RUN}", cfg.dpi))
    ]
    return ReportResult(md, plots, dict(inp.status), placeholders)
