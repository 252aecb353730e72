"""Table 1: success on held-out real tasks per method, with CIs, paired differences and
the random-admissible baseline.

Input: the evaluation episodes of every method (``data/eval/<method>.jsonl``: one row
per (task, training seed, mode, pass) with ``success``), written by the evaluate_policy
stage; the ``agent.eval.passes`` sampled passes of a (task, seed) are averaged first.
Every method plays the same test tasks with the same seeds and step limit; the headline
is the **sampled** success (temperature ``agent.eval.temperature``; every method,
random included), greedy success is reported beside it.

Statistics: a success rate varies with the tasks drawn and with the training run (seed),
so intervals come from a crossed bootstrap: tasks and training seeds are resampled
independently, each replicate averaging the (task, seed) cells drawn. An interval over
tasks alone would hold the three trained policies fixed and claim more than a rerun
repeats; with one seed (the PPO family) it is the task bootstrap. A method's difference
from SFT (and from random) is paired: the same (task, seed) cells are subtracted before
resampling. The DreamGym rows are also paired
with the claims they test (``CLAIMS``): DreamGym against real-env RL of its algorithm,
S2R against real-env RL and against the DreamGym policy it started from. ``None`` marks a
method not evaluated: nothing is ever filled in.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.artifacts import ALGOS, METHODS, RANDOM, dreamgym_method, real_method, s2r_method
from components.io import read_rows

log = logging.getLogger(__name__)

LABELS = {
    "random": "Random (admissible)",
    "sft": "SFT",
    "dpo": "DPO",
    "grpo_real": "GRPO (real env)",
    "ppo_real": "PPO (real env)",
    "dreamgym_grpo": "DreamGym GRPO",
    "dreamgym_ppo": "DreamGym PPO",
    "s2r_grpo": "DreamGym-S2R GRPO",
    "s2r_ppo": "DreamGym-S2R PPO",
}
# method -> {key in its row: the method it is paired with}: the paper's claims, that RL in
# the synthetic env matches RL in the real one, and that S2R improves on both
CLAIMS: dict[str, dict[str, str]] = {
    **{dreamgym_method(a): {"vs_real_rl": real_method(a)} for a in ALGOS},
    **{
        s2r_method(a): {"vs_real_rl": real_method(a), "vs_dreamgym": dreamgym_method(a)}
        for a in ALGOS
    },
}
SAMPLED, GREEDY = "sampled", "greedy"
HEADLINE = SAMPLED
BOOTSTRAP = 2000

Table = dict[str, Any]


def _cells(rows: Iterable[Mapping[str, Any]], mode: str) -> dict[str, dict[int, list[float]]]:
    """task -> seed -> the successes of one mode's episodes (one per evaluation pass)."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["mode"] == mode:
            out[r["task_id"]][int(r["seed"])].append(float(r["success"]))
    return {t: dict(seeds) for t, seeds in out.items()}


def _matrix(rows: Iterable[Mapping[str, Any]], mode: str) -> dict[str, dict[int, float]]:
    """task -> seed -> success of one mode's episodes (the mean over its passes)."""
    return {
        t: {s: float(np.mean(v)) for s, v in seeds.items()}
        for t, seeds in _cells(rows, mode).items()
    }


# how each env's intervals were made (``_ci_by_env``): a table archived before the crossed
# bootstrap has none and resampled tasks only
CROSSED, TASKS_ONLY = "games x training seeds", "games"
ONE_SEED = "†"  # marks a one-seed row in the markdown: its intervals are over games only


Z95 = 1.959964  # the normal quantile of a two-sided 95% interval
RATE, DIFFERENCE = (0.0, 1.0), (-1.0, 1.0)  # the ranges of a success rate and of a paired diff


def _never_degenerate(
    lo: float, hi: float, mean: float, n_tasks: int, bounds: tuple[float, float]
) -> tuple[float, float]:
    """``(lo, hi)``, or when every task scored the same (the bootstrap then returns a
    zero-width interval: 0/101 is not "exactly 0"), ``mean`` +- the Wilson upper bound of
    0 events in ``n_tasks`` (~3.8 / n), clipped to ``bounds``."""
    if hi - lo > 1e-12:
        return lo, hi
    u = Z95**2 / (n_tasks + Z95**2)
    return max(bounds[0], mean - u), min(bounds[1], mean + u)


def crossed_bootstrap(
    cells: Mapping[str, Mapping[int, float]],
    seed: int = 0,
    bounds: tuple[float, float] = RATE,
) -> tuple[float, float]:
    """95% interval of the mean over (task, training seed) cells, resampling tasks and
    seeds independently (Owen's pigeonhole bootstrap; a missing cell is skipped). Where
    every cell is equal it is widened by a Wilson bound over tasks (``_never_degenerate``);
    ``bounds`` is the range of a cell (``DIFFERENCE`` for paired differences)."""
    tasks = sorted(cells)
    seeds = sorted({s for row in cells.values() for s in row})
    if not tasks or not seeds:
        return 0.0, 1.0
    values = np.zeros((len(tasks), len(seeds)))
    present = np.zeros_like(values)
    for i, task in enumerate(tasks):
        for j, s in enumerate(seeds):
            if s in cells[task]:
                values[i, j], present[i, j] = cells[task][s], 1.0
    rng = np.random.default_rng(seed)
    # how often each task / seed is drawn in each replicate
    task_n = rng.multinomial(len(tasks), np.full(len(tasks), 1 / len(tasks)), size=BOOTSTRAP)
    seed_n = rng.multinomial(len(seeds), np.full(len(seeds), 1 / len(seeds)), size=BOOTSTRAP)
    sums = np.einsum("bi,ij,bj->b", task_n, values, seed_n)
    counts = np.einsum("bi,ij,bj->b", task_n, present, seed_n)
    means = sums[counts > 0] / counts[counts > 0]
    lo, hi = np.quantile(means, [0.025, 0.975])
    mean = float(values.sum() / present.sum())
    return _never_degenerate(float(lo), float(hi), mean, len(tasks), bounds)


def cluster_bootstrap(
    values: Mapping[str, Sequence[float]], seed: int = 0, bounds: tuple[float, float] = RATE
) -> tuple[float, float]:
    """95% interval of the mean over tasks' values, resampling tasks (seeds kept together);
    widened like ``crossed_bootstrap``'s where every value is equal."""
    keys = sorted(values)
    if not keys:
        return 0.0, 1.0
    per_task = [np.asarray(values[k], dtype=float) for k in keys]
    sums = np.array([v.sum() for v in per_task])
    counts = np.array([len(v) for v in per_task])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(BOOTSTRAP, len(keys)))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return _never_degenerate(
        float(lo), float(hi), float(sums.sum() / counts.sum()), len(keys), bounds
    )


def mode_summary(rows: Sequence[Mapping[str, Any]], mode: str) -> dict[str, Any] | None:
    """Success, 95% CI, episodes, seeds and per-seed success of one mode (None if absent)."""
    m = _matrix(rows, mode)
    if not m:
        return None
    flat = [v for seeds in m.values() for v in seeds.values()]
    episodes = sum(r["mode"] == mode for r in rows)
    lo, hi = crossed_bootstrap(m)
    seeds = sorted({s for seeds in m.values() for s in seeds})
    per_seed = {
        str(s): float(np.mean([m[t][s] for t in m if s in m[t]])) for s in seeds
    }  # keyed by string: DVC metrics skip lists
    # one seed's policy is a fixed artifact (the registered one is): its interval is over
    # tasks only
    per_seed_ci = {}
    for s in seeds:
        lo_s, hi_s = cluster_bootstrap({t: [m[t][s]] for t in m if s in m[t]}, seed=s)
        per_seed_ci[str(s)] = {"ci_low": lo_s, "ci_high": hi_s}
    return {
        "success": float(np.mean(flat)),
        "ci_low": lo,
        "ci_high": hi,
        "episodes": episodes,
        # episodes the simulator broke: counted as failures (the policy may not be at fault)
        "env_errors": sum(r["mode"] == mode and bool(r.get("env_error")) for r in rows),
        "tasks": len(m),
        "seeds": len(seeds),
        "per_seed": per_seed,
        "per_seed_ci": per_seed_ci,
    }


def paired_difference(
    rows: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]], mode: str = HEADLINE
) -> dict[str, Any] | None:
    """Mean of (method - baseline) over shared (task, seed) episodes, with a 95% CI."""
    a, b = _matrix(rows, mode), _matrix(baseline, mode)
    diffs = {t: {s: a[t][s] - b[t][s] for s in a[t] if s in b.get(t, {})} for t in a if t in b}
    diffs = {t: d for t, d in diffs.items() if d}
    if not diffs:
        return None
    lo, hi = crossed_bootstrap(diffs, seed=1, bounds=DIFFERENCE)
    flat = [v for d in diffs.values() for v in d.values()]
    return {"diff": float(np.mean(flat)), "ci_low": lo, "ci_high": hi, "pairs": len(flat)}


def method_row(
    rows: Sequence[Mapping[str, Any]],
    *,
    real_steps: int | None,
    sft: Sequence[Mapping[str, Any]] | None,
    random: Sequence[Mapping[str, Any]] | None,
    references: Mapping[str, Sequence[Mapping[str, Any]] | None] | None = None,
) -> dict[str, Any] | None:
    """One Table-1 row: headline (sampled) fields first, then greedy and paired diffs
    (``vs_sft``, ``vs_random`` and one per ``references`` key)."""
    head = mode_summary(rows, HEADLINE)
    if head is None:
        return None
    row: dict[str, Any] = {**head, "real_steps": real_steps}
    greedy = mode_summary(rows, GREEDY)
    if greedy is not None:
        row["greedy"] = {k: greedy[k] for k in ("success", "ci_low", "ci_high", "episodes")}
    for name, base in (("vs_sft", sft), ("vs_random", random), *(references or {}).items()):
        if base is not None and base is not rows:
            diff = paired_difference(rows, base)
            if diff is not None:
                row[name] = diff
    return row


def build_table(
    env: str, episodes: Mapping[str, Sequence[Mapping[str, Any]]], real_steps: Mapping[str, Any]
) -> Table:
    """``{env: {method: row or None}}`` over every Table-1 method."""
    rows: dict[str, Any] = {}
    for method in METHODS:
        eps = episodes.get(method)
        rows[method] = (
            method_row(
                eps,
                real_steps=real_steps.get(method),
                sft=episodes.get("sft"),
                random=episodes.get(RANDOM),
                references={k: episodes.get(m) for k, m in CLAIMS.get(method, {}).items()},
            )
            if eps
            else None
        )
    unknown = sorted(set(episodes) - set(METHODS))
    if unknown:
        log.warning("evaluations of unknown methods left out of Table 1: %s", unknown)
    return {env: rows, "_ci_by_env": {env: CROSSED}}


def load_episodes(eval_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every method's evaluation episodes under ``eval_dir`` (``<method>.jsonl``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(eval_dir).glob("*.jsonl")):
        out[path.stem] = read_rows(path)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def success_cell(row: Mapping[str, Any]) -> str:
    """A row's success % with its 95% CI: ``40.0 (30.0-50.0)``."""
    return f"{_pct(row['success'])} ({_pct(row['ci_low'])}-{_pct(row['ci_high'])})"


def greedy_cell(row: Mapping[str, Any]) -> str:
    """A row's greedy success % (``n/a`` when greedy decoding was not run)."""
    return _pct(row["greedy"]["success"]) if "greedy" in row else "n/a"


def diff_cell(diff: Mapping[str, Any] | None) -> str:
    """A paired difference in points with its 95% CI: ``+5.0 (-1.0, +11.0)`` (empty: none)."""
    if not diff:
        return ""
    diff_, low, high = (_points(diff[k]) for k in ("diff", "ci_low", "ci_high"))
    return f"{diff_} ({low}, {high})"


def _points(rate: float) -> str:
    """A difference of rates in signed points, one decimal; a rounding residue such as
    -1.9e-18 prints ``+0.0``, not ``-0.0``."""
    return f"{round(100 * rate, 1) + 0.0:+.1f}"


def keep_other_envs(table: Table, previous: Mapping[str, Any], env: str) -> Table:
    """``table`` (this run's ``env``) with the other envs' rows of ``previous`` kept, each
    with the provenance of the run that made it (``_provenance_by_env``)."""
    by_env = dict(previous.get("_provenance_by_env") or {})
    # Table 1 says how each env's intervals were made; a file without the key (an older
    # Table 1, or policy fidelity, which has one seed) resampled games only
    ci_tracked = "_ci_by_env" in table or "_ci_by_env" in previous
    ci_old, ci_new = previous.get("_ci_by_env") or {}, table.get("_ci_by_env") or {}
    out = dict(table)
    out["_provenance_by_env"] = {}
    ci_by_env = {env: ci_new.get(env, TASKS_ONLY)}
    for name, rows in previous.items():
        if name.startswith("_") or name == env or not isinstance(rows, dict):
            continue
        out[name] = rows
        # a file written before _provenance_by_env: its top-level provenance was that env's
        out["_provenance_by_env"][name] = by_env.get(name, previous.get("_provenance"))
        ci_by_env[name] = ci_old.get(name, TASKS_ONLY)
    out["_provenance_by_env"][env] = table.get("_provenance")
    if ci_tracked:
        out["_ci_by_env"] = ci_by_env
    return out


def markdown(table: Table) -> str:
    """The table as markdown, one section per env; methods not evaluated say so."""
    lines: list[str] = []
    ci_by_env = table.get("_ci_by_env") or {}
    for env, rows in sorted((k, v) for k, v in table.items() if not k.startswith("_")):
        seeds = {r["seeds"] for r in rows.values() if r}
        basis = ci_by_env.get(env, TASKS_ONLY)
        if seeds == {1} and basis == CROSSED:  # it had no training seeds to resample
            basis = "games (one training seed)"
        marked = 1 in seeds and len(seeds) > 1 and basis == CROSSED
        lines += [
            f"### {env}",
            "",
            "Success % on held-out test games, sampled (the headline) and greedy; 95% CIs "
            f"by bootstrap over {basis}; differences paired on the "
            "same games and seeds (vs real-env RL and vs DreamGym: against the same "
            "algorithm's row).",
            *(
                [
                    "",
                    f"{ONE_SEED} one training seed: its intervals and paired differences "
                    "resample games only (the spread between training seeds is not in them), "
                    "and vs random pairs it with the random policy's same seed.",
                ]
                if marked
                else []
            ),
            "",
            "| method | sampled % (95% CI) | greedy % | vs SFT (95% CI) | vs random "
            "| vs real-env RL (95% CI) | vs DreamGym (95% CI) | episodes | seeds | real steps |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method in METHODS:
            r = rows.get(method)
            if r is None:
                lines.append(f"| {LABELS[method]} | not evaluated | | | | | | | | |")
                continue
            vr = r.get("vs_random")
            vs_random = f"{100 * vr['diff']:+.1f}" if vr else ""
            steps = "n/a" if r["real_steps"] is None else f"{round(r['real_steps']):,}"
            label = LABELS[method] + (f" {ONE_SEED}" if marked and r["seeds"] == 1 else "")
            lines.append(
                f"| {label} | {success_cell(r)} | {greedy_cell(r)} "
                f"| {diff_cell(r.get('vs_sft'))} | {vs_random} "
                f"| {diff_cell(r.get('vs_real_rl'))} | {diff_cell(r.get('vs_dreamgym'))} "
                f"| {r['episodes']} "
                f"| {r['seeds']} | {steps} |"
            )
        broken = [
            f"{LABELS[m]} {r['env_errors']}" for m, r in rows.items() if r and r.get("env_errors")
        ]
        if broken:
            lines += ["", "Episodes the env broke, counted as failures: " + ", ".join(broken)]
        lines.append("")
    return "\n".join(lines) if lines else "No policy has been evaluated yet.\n"
