"""Report sections on the data and synthetic experience: data, fidelity, judge, drift, Theorem 1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.config import ReportConfig
from components.evaluation.judge_criteria import CRITERIA
from components.evaluation.report_format import (
    ABLATION_LABELS,
    ABLATIONS,
    _ci,
    _num,
    _ordered,
    _pairs,
    _table,
)
from components.evaluation.report_inputs import HISTORY_DIR, METRIC_FILES, NOT_RUN, _Inputs
from components.evaluation.report_plots import (
    DRIFT_PNG,
    FIDELITY_PNG,
    JUDGE_PNG,
    THEOREM1_PNG,
    _bar_plot,
    _link,
)


def _inputs_section(inp: _Inputs) -> str:
    names = [*METRIC_FILES, *sorted(n for n in inp.status if n.startswith(HISTORY_DIR + "/"))]
    rows = [[f"`{name}`", inp.status.get(name, NOT_RUN)] for name in names]
    return "## Inputs\n\n" + _table(["metrics file", "status"], rows)


def _real_data_line(data: dict[str, Any]) -> str:
    games = data.get("n_games", {})
    rates = data.get("success_rate", {})
    return (
        f"real data: {_num(data.get('n_trajectories'))} trajectories, "
        f"{_num(data.get('n_transitions'))} transitions, games per split "
        f"{', '.join(f'{k} {v}' for k, v in sorted(games.items())) or 'n/a'}; "
        f"collector success {_pairs(rates) or 'n/a'}\n"
    )


def _buffer_line(buf: dict[str, Any]) -> str:
    return (
        f"replay buffer: {_num(buf.get('rows'))} rows "
        f"({_num(buf.get('rows_real'))} real, {_num(buf.get('rows_synthetic'))} synthetic), "
        f"retrieval p50 {_num(buf.get('probe_retrieval_p50_ms'), 1)} ms\n"
    )


def _annotation_line(ann: dict[str, Any]) -> str:
    return (
        f"teacher annotation: {_num(ann.get('n_total_annotated', ann.get('n_annotated')))} "
        f"annotated, {_num(ann.get('n_failed'))} failed, cost ${_num(ann.get('cost_usd'), 2)}\n"
    )


# the one-line summaries of the data section: metrics file -> its line (without "- ")
_DATA_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "data.json": _real_data_line,
    "buffer.json": _buffer_line,
    "annotate.json": _annotation_line,
}


def _data_section(inp: _Inputs) -> str:
    out = ["## Data, buffer, annotation, experience model\n"]
    for name, line in _DATA_LINES.items():
        data = inp.get(name)
        out.append("- " + (line(data) if isinstance(data, dict) else inp.missing(name)))
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


def _fidelity_variants(fid: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(fid, dict):
        return {}
    if "eps_R" in fid:  # an older flat file: the full model only
        return {"full": fid}
    return {k: v for k, v in fid.items() if isinstance(v, dict) and not k.startswith("_")}


def _one_minus(x: Any) -> float | None:
    """1 - x, or None when x is missing (an accuracy as an error rate)."""
    return None if x is None else 1.0 - float(x)


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
                _num(_one_minus(m.get("majority_baseline_reward_accuracy"))),
                _num(m.get("success_f1")),
                _num(m.get("always_win_baseline_success_f1")),
                _num(m.get("state_exact_match")),
                _num(m.get("copy_baseline_state_exact_match")),
                _num(m.get("state_token_f1")),
                _num(m.get("copy_baseline_state_token_f1")),
                _num(m.get("eps_P")),
                _num(m.get("copy_baseline_eps_P")),
                _num(m.get("malformed_rate")),
            ]
        )
    header = ["variant", "n", "eps_R", "95% CI", "eps_R majority", "success F1"]
    header += ["F1 always-win", "state EM", "EM copy", "state F1", "F1 copy", "eps_P"]
    header += ["eps_P copy", "malformed"]
    out.append(_table(header, rows))
    out.append(
        "\neps_R: share of wrong rewards (malformed answers count as wrong). Each figure sits"
        " beside its trivial baseline: always the majority reward, every step a win, and"
        ' "nothing changes" (copy the current state).\n'
    )
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
    out.append(_link(png, "fidelity", plots))
    return "".join(out)


def _judge_section(inp: _Inputs, out_dir: Path, cfg: ReportConfig, plots: list[Path]) -> str:
    out = ["## Judge of synthetic trajectories (0-2, higher is better)\n\n"]
    judge = inp.get("judge.json")
    variants = (
        {k: v for k, v in judge.items() if isinstance(v, dict) and not k.startswith("_")}
        if isinstance(judge, dict)
        else {}
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
    out.append(_link(png, "judge", plots))
    return "".join(out)


def _drift_rows(drift: Any, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Iteration rows; ``{run: {iter_k: row}}`` (one group per synthetic run) flattened."""
    if not isinstance(drift, dict):
        return {}
    body = drift.get("iterations", drift)
    if not isinstance(body, dict):
        return {}
    rows: dict[str, dict[str, Any]] = {}
    for key, value in body.items():
        if not isinstance(value, dict) or key.startswith("_"):  # _provenance
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
    out.append(_link(png, "drift", plots))
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
    out.append(_link(png, "theorem 1", plots))
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
