"""The promotion rule: when a registered ``candidate`` model becomes the ``champion``.

Rule (metric oriented so that higher is better; lower-is-better metrics such as eps_R are
negated, and their CI flipped):

1. no champion yet: the candidate is promoted (someone must serve);
2. otherwise the candidate must **beat the champion by the margin**:
   ``candidate - champion >= margin`` and ``candidate > champion``;
3. and, when the candidate's held-out metric has a confidence interval, its **lower bound
   must not fall below** ``champion - margin``: a candidate whose interval still admits
   being clearly worse than the champion is not promoted on a lucky draw. Without an
   interval only rule 2 applies (the decision's reason says so).

Both numbers must come from the same held-out evaluation (the real test split); the
evaluation stage records them as model-version tags (``metric_tags``), and
``apply_promotion`` reads them back, decides, moves the ``champion`` alias through
components/tracking.py and records the decision on the candidate version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CANDIDATE, CHAMPION = "candidate", "champion"
TAG_PREFIX = "heldout"
_EPS = 1e-9  # metrics are decimals: 0.41 - 0.40 must count as 0.01
LOWER_IS_BETTER = frozenset({"eps_R", "eps_P", "eps_P_proxy", "malformed_rate", "eval_loss"})


@dataclass(frozen=True)
class HeldOutMetric:
    """A held-out metric with its (optional) 95% interval and sample size."""

    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError("metric value must be finite")
        if (self.ci_low is None) != (self.ci_high is None):
            raise ValueError("give both CI bounds or neither")
        if self.ci_low is not None and not self.ci_low <= self.value <= self.ci_high:  # type: ignore[operator]
            raise ValueError(f"CI [{self.ci_low}, {self.ci_high}] excludes {self.value}")


@dataclass(frozen=True)
class Decision:
    """Whether to promote, and why (the reason is recorded on the model version)."""

    promote: bool
    reason: str
    improvement: float | None = None
    candidate_version: str | None = None
    champion_version: str | None = None


def higher_is_better(metric: str) -> bool:
    """Orientation of a metric by name (errors, losses and malformed rates: lower)."""
    return metric not in LOWER_IS_BETTER


def _oriented(m: HeldOutMetric, higher: bool) -> HeldOutMetric:
    if higher:
        return m
    low = None if m.ci_high is None else -m.ci_high
    high = None if m.ci_low is None else -m.ci_low
    return HeldOutMetric(-m.value, low, high, m.n)


def decide(
    candidate: HeldOutMetric,
    champion: HeldOutMetric | None,
    margin: float,
    *,
    higher: bool = True,
) -> Decision:
    """The promotion rule (module docstring) over two held-out metrics."""
    if margin < 0:
        raise ValueError("margin must be >= 0")
    if champion is None:
        return Decision(True, "no champion yet")
    cand, champ = _oriented(candidate, higher), _oriented(champion, higher)
    gain = cand.value - champ.value
    if gain <= _EPS or gain < margin - _EPS:
        return Decision(False, f"improvement {gain:+.4f} below margin {margin}", gain)
    if cand.ci_low is None:
        return Decision(True, f"improvement {gain:+.4f} >= margin {margin} (no CI)", gain)
    floor = champ.value - margin
    if cand.ci_low < floor - _EPS:
        return Decision(
            False, f"CI lower bound {cand.ci_low:.4f} below champion - margin {floor:.4f}", gain
        )
    return Decision(
        True, f"improvement {gain:+.4f} >= margin {margin}, CI lower bound {cand.ci_low:.4f}", gain
    )


def metric_tags(metric: str, m: HeldOutMetric) -> dict[str, str]:
    """Model-version tags recording a held-out metric (read back by ``metric_from_tags``)."""
    tags = {f"{TAG_PREFIX}.{metric}": repr(float(m.value))}
    if m.ci_low is not None and m.ci_high is not None:
        tags[f"{TAG_PREFIX}.{metric}.ci_low"] = repr(float(m.ci_low))
        tags[f"{TAG_PREFIX}.{metric}.ci_high"] = repr(float(m.ci_high))
    if m.n is not None:
        tags[f"{TAG_PREFIX}.{metric}.n"] = str(int(m.n))
    return tags


def metric_from_tags(tags: Mapping[str, str], metric: str) -> HeldOutMetric | None:
    """The held-out metric stored in a version's tags, or None (absent or unreadable)."""
    key = f"{TAG_PREFIX}.{metric}"
    if key not in tags:
        return None
    try:
        low, high = tags.get(f"{key}.ci_low"), tags.get(f"{key}.ci_high")
        n = tags.get(f"{key}.n")
        return HeldOutMetric(
            float(tags[key]),
            None if low is None else float(low),
            None if high is None else float(high),
            None if n is None else int(n),
        )
    except ValueError:
        return None


def apply_promotion(
    root: Path,
    name: str,
    metric: str,
    margin: float,
    *,
    candidate_alias: str = CANDIDATE,
    champion_alias: str = CHAMPION,
) -> Decision:
    """Decide for ``name@candidate`` vs ``name@champion``; move the alias if it wins."""
    from components import tracking

    tracking.configure(root)
    cand = tracking.model_version_by_alias(name, candidate_alias)
    if cand is None:
        return Decision(False, f"no {name}@{candidate_alias}")
    cand_version, cand_tags = cand
    champ = tracking.model_version_by_alias(name, champion_alias)
    champ_version = champ[0] if champ else None
    if champ_version == cand_version:
        return Decision(
            False, "candidate is already the champion", None, cand_version, champ_version
        )
    cand_metric = metric_from_tags(cand_tags, metric)
    if cand_metric is None:
        decision = Decision(False, f"candidate has no held-out {metric}")
    elif champ is None:
        decision = decide(cand_metric, None, margin, higher=higher_is_better(metric))
    else:
        champ_metric = metric_from_tags(champ[1], metric)
        if champ_metric is None:
            decision = Decision(True, f"champion has no held-out {metric} to defend")
        else:
            decision = decide(cand_metric, champ_metric, margin, higher=higher_is_better(metric))
    decision = Decision(
        decision.promote, decision.reason, decision.improvement, cand_version, champ_version
    )
    if decision.promote:
        tracking.set_model_alias(name, champion_alias, cand_version)
    tracking.tag_model_alias(
        name,
        candidate_alias,
        {
            "promotion.decision": "promoted" if decision.promote else "kept champion",
            "promotion.reason": decision.reason,
            "promotion.metric": metric,
            "promotion.compared_to": champ_version or "none",
        },
    )
    return decision
