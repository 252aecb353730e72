"""Markdown formatting of the report: numbers, percents, intervals, tables, method labels."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from components.agent.table1 import LABELS as TABLE1_LABELS
from components.evaluation.judge_criteria import VARIANT_LABELS, VARIANTS

# Table-1 methods in their order, with their labels (one home: components/agent/table1.py)
METHOD_LABELS = TABLE1_LABELS
ABLATIONS = (*VARIANTS, "no_task_generation")
ABLATION_LABELS = {**VARIANT_LABELS, "no_task_generation": "w/o task generation"}


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
