"""The judge's shared rubric: criteria, 0/1/2 scores, variants, sampling and aggregation."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from components.artifacts import FULL, NO_HISTORY, NO_REASONING, NO_REPLAY
from components.schema import Trajectory

CRITERIA = ("consistency", "diversity", "informativeness", "hallucination")
SCORES = (0, 1, 2)
# the ablation variants compared (components.artifacts.VARIANTS), in the judge's report order
VARIANTS = (FULL, NO_HISTORY, NO_REASONING, NO_REPLAY)
VARIANT_LABELS = {
    FULL: "DreamGym (full)",
    NO_HISTORY: "w/o history",
    NO_REASONING: "w/o reasoning",
    NO_REPLAY: "w/o replay",
}
GROUNDED, OPENAI = "grounded", "openai"


class JudgeError(RuntimeError):
    """The judge cannot run (missing key, unknown price with a budget, bad input)."""


def to_score(value: float) -> int:
    """A mean score in [0, 2] rounded half up to the rubric's 0/1/2."""
    return int(min(2, max(0, math.floor(value + 0.5))))


# -- results ---------------------------------------------------------------------------------


@dataclass
class JudgeOutput:
    """A judged sample: the summary, one row per trajectory, one per replayed transition."""

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    transitions: list[dict[str, Any]] = field(default_factory=list)


class Judge(Protocol):
    """Scores trajectories on the four criteria (failures are rows, never exceptions)."""

    backend: str

    def judge(self, trajectories: Sequence[Trajectory]) -> JudgeOutput:
        """Score every trajectory; rows in input order."""
        ...


def sample_trajectories(trajectories: Sequence[Trajectory], n: int, seed: int) -> list[Trajectory]:
    """A seeded sample of at most ``n`` synthetic trajectories (same input, same sample)."""
    pool = sorted(
        (t for t in trajectories if t.source == "synthetic" and t.steps),
        key=lambda t: t.episode_id,
    )
    if len(pool) <= n:
        return pool
    return random.Random(seed).sample(pool, n)


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per criterion: mean over judged trajectories, 0/1/2 distribution and count."""
    judged = [r for r in rows if r.get("status", "ok") == "ok"]
    out: dict[str, Any] = {
        "n": len(judged),
        "n_rows": len(rows),
        "n_failed": sum(r.get("status") == "failed" for r in rows),
        "n_skipped": sum(r.get("status") == "skipped" for r in rows),
    }
    for c in CRITERIA:
        values = [int(r[c]) for r in judged if r.get(c) is not None]
        counts = Counter(values)
        out[c] = {
            "mean": sum(values) / len(values) if values else None,
            "n": len(values),
            "distribution": {str(s): counts.get(s, 0) for s in SCORES},
        }
    return out


def judge_metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics-file entry of one variant: each criterion's mean and ``n``."""
    out: dict[str, Any] = {c: summary[c]["mean"] for c in CRITERIA}
    out["n"] = summary["n"]
    return out


def compare_variants(summaries: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], str]:
    """One table of the variants' judge scores: (``{variant: metrics}``, markdown)."""
    order = [v for v in VARIANTS if v in summaries] + sorted(set(summaries) - set(VARIANTS))
    table = {v: judge_metrics(summaries[v]) for v in order}
    head = "| variant | n | " + " | ".join(CRITERIA) + " |"
    lines = [head, "|" + "---|" * (len(CRITERIA) + 2)]
    for v in order:
        m = table[v]
        cells = ["n/a" if m[c] is None else f"{m[c]:.2f}" for c in CRITERIA]
        lines.append(f"| {VARIANT_LABELS.get(v, v)} | {m['n']} | " + " | ".join(cells) + " |")
    note = "Scores 0-2 (higher is better; hallucination 2 = none), mean over trajectories."
    return table, "\n".join(lines) + "\n\n" + note + "\n"
