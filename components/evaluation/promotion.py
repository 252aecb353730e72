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
components/model_registry.py and records the decision on the candidate version.

Quality floors come first, champion or not (a model with reward accuracy 0 must never
serve): every floor metric of the candidate must **beat its trivial baseline** on the
same held-out data (``baseline_tags``): the experience model its reward accuracy the
majority class and its next-state match "nothing changes" (``EXPERIENCE_FLOORS``); a
policy its success the random policy. ``policy@champion`` is the method with the best
held-out success in Table 1 (``apply_policy_promotion``).

Ablation experiments (any ``ablation.*`` switch on) register under ``<name>-ablation``
with an ``ablation`` tag and no alias (``registry_target``), and are never promoted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.artifacts import RANDOM

CANDIDATE, CHAMPION = "candidate", "champion"
TAG_PREFIX = "heldout"
BASELINE_PREFIX = "baseline"
ABLATION_SUFFIX = "-ablation"
POLICY_METRIC = "success"
RANDOM_METHOD = RANDOM
# (metric, its trivial baseline in metrics/fidelity.json) the experience model must beat
EXPERIENCE_FLOORS = (
    ("reward_accuracy", "majority_baseline_reward_accuracy"),
    ("state_exact_match", "copy_baseline_state_exact_match"),
    ("state_token_f1", "copy_baseline_state_token_f1"),
)
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


def baseline_tags(metric: str, value: float) -> dict[str, str]:
    """Model-version tag recording the trivial baseline a floor ``metric`` must beat."""
    return {f"{BASELINE_PREFIX}.{metric}": repr(float(value))}


def floor_failure(tags: Mapping[str, str], floors: Sequence[str]) -> str | None:
    """Why a candidate fails its quality floors (None: it beats every baseline)."""
    for metric in floors:
        cand = metric_from_tags(tags, metric)
        raw = tags.get(f"{BASELINE_PREFIX}.{metric}")
        if cand is None or raw is None:
            return f"no held-out {metric} and baseline to check the quality floor"
        try:
            base = float(raw)
        except ValueError:
            return f"unreadable baseline of {metric}: {raw!r}"
        higher = higher_is_better(metric)
        gain = cand.value - base if higher else base - cand.value
        if gain <= _EPS:  # a tie with a trivial baseline is no model
            return f"{metric} {cand.value:.4f} does not beat its baseline {base:.4f}"
    return None


def ablation_of(switches: Mapping[str, bool]) -> str | None:
    """The ablation switches that are on, comma-joined (None: not an ablation run)."""
    on = sorted(k for k, v in switches.items() if v)
    return ",".join(on) or None


def registry_target(
    name: str, aliases: tuple[str, ...], switches: Mapping[str, bool]
) -> tuple[str, tuple[str, ...], dict[str, str]]:
    """(registered name, aliases, extra tags) of a model trained under ``switches``.

    An ablation run registers under ``<name>-ablation``, tagged with its switches, and
    sets no alias: it never moves ``candidate``, ``champion`` or a method's alias.
    """
    ablation = ablation_of(switches)
    if ablation is None:
        return name, aliases, {}
    return f"{name}{ABLATION_SUFFIX}", (), {"ablation": ablation}


def apply_promotion(
    root: Path,
    name: str,
    metric: str,
    margin: float,
    *,
    candidate_alias: str = CANDIDATE,
    champion_alias: str = CHAMPION,
    floors: Sequence[str] = (),
) -> Decision:
    """Decide for ``name@candidate`` vs ``name@champion``; move the alias if it wins.

    ``floors``: metrics the candidate must beat its trivial baseline on (``baseline_tags``)
    before it is compared with the champion at all.
    """
    from components import model_registry, tracking

    tracking.configure(root)
    if name.endswith(ABLATION_SUFFIX):
        return Decision(False, f"{name} is an ablation: never promoted")
    cand = model_registry.model_version_by_alias(name, candidate_alias)
    if cand is None:
        return Decision(False, f"no {name}@{candidate_alias}")
    cand_version, cand_tags = cand
    champ = model_registry.model_version_by_alias(name, champion_alias)
    champ_version = champ[0] if champ else None
    if champ_version == cand_version:
        return Decision(
            False, "candidate is already the champion", None, cand_version, champ_version
        )
    cand_metric = metric_from_tags(cand_tags, metric)
    failure = floor_failure(cand_tags, floors)
    elsewhere = _measured_elsewhere(cand_tags, champ[1] if champ else {})
    if "ablation" in cand_tags:
        decision = Decision(False, f"candidate is an ablation ({cand_tags['ablation']})")
    elif elsewhere is not None:
        decision = Decision(False, elsewhere)
    elif cand_metric is None:
        decision = Decision(False, f"candidate has no held-out {metric}")
    elif failure is not None:
        decision = Decision(False, f"quality floor: {failure}")
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
        model_registry.set_model_alias(name, champion_alias, cand_version)
    model_registry.tag_model_alias(
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


def _measured_elsewhere(cand: Mapping[str, str], champ: Mapping[str, str]) -> str | None:
    """Why the two versions' held-out figures cannot be compared (another env or profile:
    other test tasks), or None. A version registered before these tags compares as before."""
    for key in ("env", "profile"):
        if key in cand and key in champ and cand[key] != champ[key]:
            return (
                f"the champion was measured on {key} {champ[key]}, the candidate on "
                f"{cand[key]}: not comparable (other test tasks)"
            )
    return None


SeedOf = Callable[[str], int]  # method -> the training seed whose policy is registered


def _registered_figures(row: Mapping[str, Any], seed: int | None) -> tuple[Any, Any, Any]:
    """(success, ci_low, ci_high) of the registered seed's policy where the row has them
    (``per_seed``, ``per_seed_ci``), else the method's figures over all its seeds."""
    if seed is not None:
        success = (row.get("per_seed") or {}).get(str(seed))
        ci = (row.get("per_seed_ci") or {}).get(str(seed)) or {}
        if success is not None and ci.get("ci_low") is not None:
            return success, ci["ci_low"], ci.get("ci_high")
    return row.get("success"), row.get("ci_low"), row.get("ci_high")


def best_method(rows: Mapping[str, Any], seed_of: SeedOf | None = None) -> str | None:
    """The trained method with the highest held-out success in a Table-1 section (of the
    policy registered for it, where ``seed_of`` names its seed)."""
    held_out = _held_out_rows(rows, seed_of)
    scored = {m: h.value for m, h in held_out.items()}
    return max(sorted(scored), key=lambda m: scored[m]) if scored else None


def _held_out_rows(
    rows: Mapping[str, Any], seed_of: SeedOf | None = None
) -> dict[str, HeldOutMetric]:
    """Each trained method's held-out success in a Table-1 section (its CI widened to hold
    it). The version behind ``policy@<method>`` is one seed's policy (``seed_of``): its
    own figures, not the mean over seeds, are what it is tagged and ranked with."""
    out = {}
    for method, row in rows.items():
        if method == RANDOM_METHOD or not isinstance(row, Mapping) or row.get("success") is None:
            continue
        seed = seed_of(method) if seed_of is not None else None
        success, low, high = _registered_figures(row, seed)
        success = float(success)
        has_ci = low is not None and high is not None
        out[method] = HeldOutMetric(
            success,
            min(float(low), success) if has_ci else None,
            max(float(high), success) if has_ci else None,
            row.get("episodes"),
        )
    return out


def apply_policy_promotion(
    root: Path,
    table1: Mapping[str, Any],
    margin: float,
    *,
    name: str = "policy",
    env: str | None = None,
    ablation: str | None = None,
    seed_of: SeedOf | None = None,
) -> Decision:
    """``policy@champion`` from Table 1: the best held-out success, above random.

    ``env``: the section to read; Table 1 also carries the other envs' merged sections,
    whose policies are registered in their own workspaces, not here (None: the only one).
    The best method's version (alias = the method) gets its held-out success and the
    random policy's as tags, then the promotion rule runs with the success floor.
    ``ablation``: the run's ablation switches that are on (``ablation_of``); such a run's
    Table 1 never tags or promotes a version (its method aliases are a normal run's).
    ``seed_of``: the training seed whose policy each method registered (None: rank and
    tag on the mean over seeds).
    """
    from components import model_registry, tracking

    if ablation is not None:
        return Decision(False, f"an ablation run ({ablation}): never promoted")

    envs = [k for k, v in table1.items() if not k.startswith("_") and isinstance(v, Mapping)]
    if env is None and len(envs) != 1:
        return Decision(False, f"expected one environment in table1, got {envs}")
    env = envs[0] if env is None else env
    if env not in envs:
        return Decision(False, f"no {env} section in table1 (it has {envs})")
    rows = table1[env]
    method = best_method(rows, seed_of)
    if method is None:
        return Decision(False, "no evaluated policy in table1")
    random_row = rows.get(RANDOM_METHOD)
    if not isinstance(random_row, Mapping) or random_row.get("success") is None:
        return Decision(False, "no random baseline in table1: the floor cannot be checked")
    tracking.configure(root)
    # Every evaluated method's version gets this table's figures, not only the best: the
    # champion is often one of them, and a stale, higher tag would defend it against
    # the fresh ones.
    baseline = baseline_tags(POLICY_METRIC, float(random_row["success"]))
    tagged = {
        m: model_registry.tag_model_alias(
            name, m, {**metric_tags(POLICY_METRIC, held_out), **baseline}
        )
        for m, held_out in _held_out_rows(rows, seed_of).items()
    }
    if tagged.get(method) is None:
        return Decision(False, f"no {name}@{method} registered")
    return apply_promotion(
        root, name, POLICY_METRIC, margin, candidate_alias=method, floors=(POLICY_METRIC,)
    )
