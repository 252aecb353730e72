"""Report sections on the agents: Table 1 (with the paper's numbers), RL curves, ablations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from components.config import ReportConfig
from components.evaluation.report_experience import _fidelity_variants
from components.evaluation.report_format import (
    ABLATION_LABELS,
    ABLATIONS,
    METHOD_LABELS,
    _ci,
    _method_label,
    _num,
    _ordered,
    _pct,
    _table,
)
from components.evaluation.report_inputs import HISTORY_DIR, NOT_RUN, _Inputs
from components.evaluation.report_plots import (
    CURVES_PNG,
    SUCCESS_PNG,
    _bar_plot,
    _curve_plot,
    _link,
)

# the paper's Table 1 (arXiv 2511.03773): success % (Llama-3.2-3B / Llama-3.1-8B /
# Qwen-2.5-7B), for context only
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
# the paper's ablations, Llama-3.1-8B, success % WebShop / WebArena (no w/o history row)
PAPER_ABLATION = {
    "full": "63.9 / 13.3",
    "no_replay": "59.2 / 9.7",
    "no_reasoning": "55.8 / 7.3",
    "no_task_generation": "57.3 / 7.3",
}


def _table1_rows(t1: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """``{env: {method: row}}`` with the methods not evaluated (None) left out."""
    if not isinstance(t1, dict):
        return {}
    out = {}
    for env, methods in t1.items():
        if str(env).startswith("_"):  # _provenance, _provenance_by_env, _headline
            continue
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
        "vs real-env RL (95% CI)",
        "vs DreamGym (95% CI)",
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
                    _diff(m.get("vs_real_rl"), with_ci=True),
                    _diff(m.get("vs_dreamgym"), with_ci=True),
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
    out.append(_link(png, "success on held-out tasks", plots, end="\n\n"))
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
    out.append(_link(png, "RL curves", plots))
    return "".join(out)


def _ablation_section(inp: _Inputs, env: str | None = None) -> str:
    fid = _fidelity_variants(inp.get("fidelity.json"))
    judge = inp.get("judge.json") if isinstance(inp.get("judge.json"), dict) else {}
    success: dict[str, float] = {}
    t1 = inp.get("table1.json")
    if isinstance(t1, dict) and t1:
        # the run's env only: fidelity and judge are its, another env's success is not
        envs = [k for k in t1 if not k.startswith("_")]
        env = env if env is not None else (envs[0] if len(envs) == 1 else None)
        block = t1.get(env) if env is not None else None
        methods = block if isinstance(block, dict) else {}
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
