"""Policy-level fidelity: does a policy succeed as often in the dream as in the real env?

Transition-level fidelity (``fidelity.py``) scores one step at a time on recorded actions;
it cannot see a dream that lets the policy *choose* steps the real env would not offer,
or that is easier on one task family than another. Here fixed policies (SFT and the
DreamGym policy) play the same train games in the synthetic env and in the real one, and
the success rates are compared per task family, beside trivial baselines:

- ``family_mae`` (dream) against ``family_mae_constant``: predicting every family's real
  success by the policy's pooled real success (a dream that only knows the average);
- the dream's gain of one policy over another against ``gain_error_none``: predicting
  no change at all.

Open loop: the gap between the two sides has two sources. Each dreamt episode's actions are
replayed in the real env (``replay_won``), so that

    dream - real = (dream - open loop)  +  (open loop - real)
                    the dream's verdict     closed-loop divergence: real observations
                    on its own episodes     steer the policy to other actions

The first is the experience model calling an action sequence a win the real env does not
(or missing one); the second is the dream showing states the real env does not, so the
same policy acts differently. The trivial baseline of the verdict's precision (the share
of dreamt wins that replay as real wins) is the open-loop rate: a dream that called every
episode a win would be right that often on the same episodes. A gain between two policies
splits the same way (its ``open_loop`` part: the real gain of the dreamt actions).

Rows are plain dicts: ``method, side ("dream" | "real"), task_id, family, pass, won``,
plus ``actions`` and, on dream rows, ``replay_won``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from components.schema import Task

DREAM, REAL = "dream", "real"
SIDES = (DREAM, REAL)
OPEN_LOOP = "open_loop"  # the real env's verdict on the dreamt episodes' actions
REPLAY_WON = "replay_won"  # on a dream row: its actions, replayed in the real env, won


def select_games(tasks: Iterable[Task], per_family: int, seed: int) -> list[Task]:
    """Up to ``per_family`` real train games of each family, a seeded sample, sorted."""
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        if t.split == "train" and not t.generated:
            by_family[t.family].append(t)
    picked: list[Task] = []
    for family in sorted(by_family):
        pool = sorted(by_family[family], key=lambda t: t.task_id)
        random.Random(f"{seed}-policy-fidelity-{family}").shuffle(pool)
        picked += pool[:per_family]
    return sorted(picked, key=lambda t: t.task_id)


def _per_task(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """task -> success averaged over its passes."""
    won: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        won[r["task_id"]].append(float(r["won"]))
    return {t: float(np.mean(v)) for t, v in won.items()}


def _replayed(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """task -> how often the dreamt episodes' actions win when replayed in the real env."""
    return _per_task(
        {**r, "won": r[REPLAY_WON]} for r in rows if r["side"] == DREAM and REPLAY_WON in r
    )


def _rate(values: Mapping[str, float]) -> dict[str, Any]:
    """Mean over tasks with a 95% bootstrap interval over tasks."""
    from components.agent.table1 import cluster_bootstrap

    lo, hi = cluster_bootstrap({t: [v] for t, v in values.items()})
    mean = float(np.mean(list(values.values()))) if values else 0.0
    return {"success": mean, "ci_low": lo, "ci_high": hi, "tasks": len(values)}


def _paired(a: Mapping[str, float], b: Mapping[str, float], seed: int) -> dict[str, Any]:
    """Mean of a - b over shared tasks with a 95% bootstrap interval over tasks."""
    from components.agent.table1 import DIFFERENCE, cluster_bootstrap

    diffs = {t: [a[t] - b[t]] for t in a if t in b}
    lo, hi = cluster_bootstrap(diffs, seed=seed, bounds=DIFFERENCE)
    mean = float(np.mean([d[0] for d in diffs.values()])) if diffs else 0.0
    return {"diff": mean, "ci_low": lo, "ci_high": hi, "tasks": len(diffs)}


def method_fidelity(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One policy's dream vs real success: overall, per family, and the family-level errors."""
    side = {s: _per_task(r for r in rows if r["side"] == s) for s in SIDES}
    family_of = {r["task_id"]: r["family"] for r in rows}
    families: dict[str, Any] = {}
    for fam in sorted(set(family_of.values())):
        rates = {s: [v for t, v in side[s].items() if family_of[t] == fam] for s in SIDES}
        if not rates[DREAM] or not rates[REAL]:
            continue
        dream, real = float(np.mean(rates[DREAM])), float(np.mean(rates[REAL]))
        families[fam] = {
            "dream": dream,
            "real": real,
            "gap": dream - real,
            "tasks": len(rates[REAL]),
        }
    pooled_real = float(np.mean(list(side[REAL].values()))) if side[REAL] else 0.0
    errors = [abs(f["gap"]) for f in families.values()]
    constant = [abs(pooled_real - f["real"]) for f in families.values()]
    out = {
        DREAM: _rate(side[DREAM]),
        REAL: _rate(side[REAL]),
        "gap": _paired(side[DREAM], side[REAL], seed=1),
        "families": families,
        "family_mae": float(np.mean(errors)) if errors else 0.0,
        "family_mae_constant": float(np.mean(constant)) if constant else 0.0,
        "episodes": sum(r["side"] == REAL for r in rows),
        # episodes the env broke (counted as losses): a real-side crash widens the gap
        "env_errors": {
            s: sum(r["side"] == s and bool(r.get("env_error")) for r in rows) for s in SIDES
        },
    }
    loop = open_loop_fidelity(rows)
    if loop is not None:
        out[OPEN_LOOP] = loop
        replayed = _replayed(rows)
        for fam, f in families.items():
            f[OPEN_LOOP] = float(np.mean([v for t, v in replayed.items() if family_of[t] == fam]))
    return out


def open_loop_fidelity(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The gap split in two: the dream's verdict on its own episodes (dream - open loop) and
    closed-loop divergence (open loop - real); None without replayed dream rows."""
    dream = [r for r in rows if r["side"] == DREAM and REPLAY_WON in r]
    if not dream:
        return None
    dreamt = _per_task(dream)
    replayed = _replayed(dream)
    real = _per_task(r for r in rows if r["side"] == REAL)
    wins = [bool(r[REPLAY_WON]) for r in dream if r["won"]]
    losses = [bool(r[REPLAY_WON]) for r in dream if not r["won"]]
    return {
        "success": _rate(replayed),
        "verdict_error": _paired(dreamt, replayed, seed=4),
        "closed_loop_divergence": _paired(replayed, real, seed=5),
        "dream_wins": len(wins),
        "precision": float(np.mean(wins)) if wins else None,  # dreamt wins that are real
        # the trivial verdict "every dreamt episode is a win" has the replays' win rate as
        # its precision (the same episodes), not the policy's closed-loop real rate
        "precision_baseline": float(np.mean([bool(r[REPLAY_WON]) for r in dream])),
        "dream_losses": len(losses),
        "missed_wins": int(sum(losses)),  # dreamt losses whose actions win in the real env
    }


def gain_fidelity(
    rows: Sequence[Mapping[str, Any]], method: str, baseline: str
) -> dict[str, Any] | None:
    """The dream's gain of ``method`` over ``baseline`` beside the real one (same games)."""
    by = {
        (m, s): _per_task(r for r in rows if r["method"] == m and r["side"] == s)
        for m in (method, baseline)
        for s in SIDES
    }
    if not all(by.values()):
        return None
    dream = _paired(by[(method, DREAM)], by[(baseline, DREAM)], seed=2)
    real = _paired(by[(method, REAL)], by[(baseline, REAL)], seed=3)
    out = {
        DREAM: dream,
        REAL: real,
        "error": abs(dream["diff"] - real["diff"]),
        "gain_error_none": abs(real["diff"]),  # trivial: "the policy did not change"
        "same_sign": bool(np.sign(dream["diff"]) == np.sign(real["diff"])),
    }
    replayed = [_replayed(r for r in rows if r["method"] == m) for m in (method, baseline)]
    if all(replayed):
        # the gain the dreamt actions make in the real env: dream - open loop is the part
        # owed to the dream's verdicts, open loop - real the part owed to divergence
        out[OPEN_LOOP] = _paired(replayed[0], replayed[1], seed=6)
    return out


def summarise(rows: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Per method's dream vs real fidelity, and the gain of each later method over the first."""
    out: dict[str, Any] = {"methods": {}, "gains": {}}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        if mine:
            out["methods"][m] = method_fidelity(mine)
    for m in methods[1:]:
        gain = gain_fidelity(rows, m, methods[0])
        if gain is not None:
            out["gains"][f"{m}-{methods[0]}"] = gain
    return out


def markdown(env: str, doc: Mapping[str, Any]) -> str:
    """One env's figure as a markdown table (percent; gap = dream - real)."""
    lines = [
        f"### {env}: dream vs real success on the same train games",
        "",
        "| policy | family | dream % | real % | gap |",
        "|---|---|---|---|---|",
    ]
    for m, f in doc["methods"].items():
        g = f["gap"]
        lines.append(
            f"| {m} | all | {100 * f[DREAM]['success']:.1f} | {100 * f[REAL]['success']:.1f} | "
            f"{100 * g['diff']:+.1f} ({100 * g['ci_low']:+.1f}, {100 * g['ci_high']:+.1f}) |"
        )
        for fam, v in f["families"].items():
            lines.append(
                f"| {m} | {fam} | {100 * v['dream']:.1f} | {100 * v['real']:.1f} | "
                f"{100 * v['gap']:+.1f} |"
            )
        lines.append(
            f"| {m} | family MAE | {100 * f['family_mae']:.1f} | constant: "
            f"{100 * f['family_mae_constant']:.1f} | |"
        )
        if OPEN_LOOP in f:
            lines.append(_open_loop_line(m, f[OPEN_LOOP]))
    for name, g in doc["gains"].items():
        lines.append(
            f"| gain {name} | all | {100 * g[DREAM]['diff']:+.1f} | {100 * g[REAL]['diff']:+.1f} "
            f"| error {100 * g['error']:.1f} (no-change: {100 * g['gain_error_none']:.1f}) |"
        )
        if OPEN_LOOP in g:
            lines.append(
                f"| gain {name} | open loop (dreamt actions, real env) | "
                f"{100 * g[OPEN_LOOP]['diff']:+.1f} | | |"
            )
    return "\n".join(lines) + "\n"


def _open_loop_line(method: str, loop: Mapping[str, Any]) -> str:
    """One table row: the open-loop replay's split of the gap."""
    v, d = loop["verdict_error"], loop["closed_loop_divergence"]
    prec = loop["precision"]
    precision = "n/a" if prec is None else f"{100 * prec:.1f}"
    replayed = 100 * loop["success"]["success"]
    return (
        f"| {method} | open loop (dreamt actions, real env) | {replayed:.1f} "
        f"| precision {precision} (base rate {100 * (loop['precision_baseline'] or 0):.1f}), "
        f"{loop['missed_wins']}/{loop['dream_losses']} losses win | "
        f"verdict {100 * v['diff']:+.1f}, divergence {100 * d['diff']:+.1f} |"
    )


def markdown_all(table: Mapping[str, Any]) -> str:
    """Every env's figure of a side-by-side policy_fidelity.json, one section each."""
    return "".join(markdown(env, d) + "\n" for env, d in sorted(table.items()) if env[0] != "_")
