"""Table 1: success on held-out real tasks per env and method, with the real steps used.

Input: one evaluation JSON per (env, method), as written by the evaluate_policy stage
(``env``, ``method``, ``success``, ``ci_low``, ``ci_high``, ``episodes``, ``seeds``,
``real_steps``). Output: ``{env: {method: row | None}}`` over the eight methods of the
paper's table, where ``None`` marks a method that has not been evaluated (nothing is
ever filled in for it), and the same table as markdown.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METHODS = (
    "sft",
    "dpo",
    "grpo_real",
    "ppo_real",
    "dreamgym_grpo",
    "dreamgym_ppo",
    "s2r_grpo",
    "s2r_ppo",
)
LABELS = {
    "sft": "SFT",
    "dpo": "DPO",
    "grpo_real": "GRPO (real env)",
    "ppo_real": "PPO (real env)",
    "dreamgym_grpo": "DreamGym GRPO",
    "dreamgym_ppo": "DreamGym PPO",
    "s2r_grpo": "DreamGym-S2R GRPO",
    "s2r_ppo": "DreamGym-S2R PPO",
}
FIELDS = ("success", "ci_low", "ci_high", "episodes", "seeds", "real_steps")

Table = dict[str, dict[str, dict[str, Any] | None]]


def row(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """The table fields of one evaluation (``real_steps`` None when it was not recorded)."""
    missing = [k for k in FIELDS if k not in evaluation and k != "real_steps"]
    if missing:
        raise ValueError(f"evaluation of {evaluation.get('method')!r} lacks {missing}")
    return {k: evaluation.get(k) for k in FIELDS}


def build_table(evaluations: Iterable[Mapping[str, Any]]) -> Table:
    """``{env: {method: row or None}}`` for every env evaluated and every Table-1 method."""
    table: Table = {}
    for ev in evaluations:
        env, method = ev["env"], ev["method"]
        if method not in METHODS:
            log.warning("evaluation of unknown method %r left out of Table 1", method)
            continue
        rows = table.setdefault(env, dict.fromkeys(METHODS))
        if rows[method] is not None:
            raise ValueError(f"two evaluations of {method!r} on {env!r}")
        rows[method] = row(ev)
    return table


def load_evaluations(eval_dir: Path) -> list[dict[str, Any]]:
    """Every evaluation JSON under ``eval_dir`` (none if it does not exist)."""
    if not eval_dir.exists():
        return []
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(eval_dir.glob("*.json"))]


def markdown(table: Table) -> str:
    """The table as markdown, one section per env; methods not evaluated say so."""
    lines: list[str] = []
    for env, rows in sorted(table.items()):
        lines += [
            f"### {env}",
            "",
            "| method | success % (95% CI) | episodes | seeds | real steps (training) |",
            "|---|---|---|---|---|",
        ]
        for method in METHODS:
            r = rows.get(method)
            if r is None:
                lines.append(f"| {LABELS[method]} | not evaluated | | | |")
                continue
            steps = "n/a" if r["real_steps"] is None else f"{r['real_steps']:,}"
            lines.append(
                f"| {LABELS[method]} | {100 * r['success']:.1f} "
                f"({100 * r['ci_low']:.1f}-{100 * r['ci_high']:.1f}) | {r['episodes']} "
                f"| {r['seeds']} | {steps} |"
            )
        lines.append("")
    return "\n".join(lines) if lines else "No policy has been evaluated yet.\n"
