"""What generated tasks add to DreamGym GRPO when real train tasks are scarce.

The paper's task generator exists to give the learner new tasks at its frontier. With all
160 train games and the variance sampler, TextWorld DreamGym GRPO scores the same with and
without generated tasks; this bench asks when they matter. For each real task budget
(``curriculum.max_real_tasks``: a fixed random subset of the train games, the same for
every seed) it retrains DreamGym GRPO three ways on the project (no generated tasks,
``generated_order=newest`` (the default), ``generated_order=frontier``), evaluates each
on the selection suite (fresh games, never test) and pairs them per game and training
seed, with a 95% CI that resamples games and seeds (a rerun trains other seeds). One
pooled verdict per pair averages the scarce budgets (each budget's seeds are their own
runs). Run it from a TextWorld cpu project after ``make run`` and
``python -m bench.selection generate``:

    python -m bench.task_scarcity                  # ~55 min on 2 cores; resumable
    python -m bench.task_scarcity --budgets 16,32  # some budgets only
    python -m bench.task_scarcity --seeds 0,1,2,3,4,5  # trains only the seeds an arm lacks
    python -m bench.task_scarcity --compare-to before  # beside scarce*_<arm>_before.jsonl

Each arm is ``python -m bench.selection retrain scarce<budget>_<arm> --kind dreamgym``
with the arm's overrides; an arm whose results exist is not retrained (delete
``data/selection/results/scarce*.jsonl`` to redo it). Every arm is retrained, even the
one the project's settings match: its policies may come from older code.
Writes ``bench/results/task_scarcity.json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from bench.common import bench_parser
from bench.selection import (
    RETRAINED,
    SEEDS,
    SUITE,
    evaluate,
    overridden,
    paired,
    per_game_rows,
    retrain,
    sft_starts,
)

OUT = Path("bench/results/task_scarcity.json")
Cells = dict[str, dict[int, float]]  # game -> training seed -> mean success
ARMS: dict[str, list[str]] = {
    "no_generation": ["ablation.no_task_generation=true"],
    "newest": ['curriculum.generated_order="newest"'],
    "frontier": ['curriculum.generated_order="frontier"'],
}
# (a, b) pairs reported: what generation adds, and what the frontier order adds to it
PAIRS = (("newest", "no_generation"), ("frontier", "no_generation"), ("frontier", "newest"))


def arm_result(
    cfg: Any, root: Path, suite: Path, budget: int, arm: str, seeds: Sequence[int] = SEEDS
) -> Path:
    """The arm's per-episode results on the suite; seeds missing from them are retrained
    and evaluated, and their rows added (the other seeds' rows stay)."""
    name = f"scarce{budget}_{arm}"
    out = suite / "results" / f"{name}.jsonl"
    have = {r["seed"] for r in _rows(out)} if out.is_file() else set()
    missing = [s for s in seeds if s not in have]
    if not missing:
        return out
    sets = [*ARMS[arm], f"curriculum.max_real_tasks={budget}"]
    start = time.perf_counter()
    # a seed beyond the project's agent.seeds has no SFT start yet
    sft_starts(cfg, root, missing)
    retrain(overridden(cfg, sets), root, name, "dreamgym", "grpo", seeds=missing)
    summary = evaluate(
        cfg, root, suite, name, RETRAINED + name, seeds=missing, keep_other_seeds=True
    )
    print(
        f"{name} (seeds {missing} added): {100 * summary['success']:.1f}% over "
        f"{summary['episodes']} episodes in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return out


def _rows(path: Path, seeds: Collection[int] | None = None) -> list[dict[str, Any]]:
    """A results file's episodes (of ``seeds`` only, when given)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if seeds is None or r["seed"] in seeds]


def cells(path: Path, seeds: Collection[int]) -> dict[str, dict[int, float]]:
    """game -> training seed -> mean success over its passes, for ``seeds``."""
    return per_game_rows(_rows(path, seeds))


def pooled(per_budget: dict[str, tuple[Cells, Cells]]) -> dict[str, float]:
    """Mean a - b over every budget's (game, seed) cells, with a 95% CI: each (budget, seed)
    is its own training run, resampled as one seed is (runs share nothing across budgets)."""
    from components.agent.table1 import DIFFERENCE, crossed_bootstrap

    diffs: dict[str, dict[tuple[str, int], float]] = {}
    for budget, (a, b) in per_budget.items():
        for g in set(a) & set(b):
            for s in set(a[g]) & set(b[g]):
                diffs.setdefault(g, {})[(budget, s)] = a[g][s] - b[g][s]
    flat = [v for d in diffs.values() for v in d.values()]
    low, high = crossed_bootstrap(diffs, bounds=DIFFERENCE)  # type: ignore[arg-type]  # (budget, seed) keys sort too
    mean = sum(flat) / len(flat)
    return {"diff": round(mean, 4), "ci_low": round(low, 4), "ci_high": round(high, 4)}


def compare_to(
    suite: Path, budget: int, files: dict[str, Path], tag: str, seeds: Collection[int]
) -> dict[str, Any]:
    """Each arm's kept ``tag`` results (summary) and the arm's paired gain over them."""
    out: dict[str, Any] = {}
    for arm, current in files.items():
        kept = suite / "results" / f"scarce{budget}_{arm}_{tag}.jsonl"
        if not kept.is_file():
            continue
        res = paired(cells(current, seeds), cells(kept, seeds))
        out[f"{arm}_{tag}"] = summarise(kept, seeds)
        out[f"{arm}_vs_{arm}_{tag}"] = {k: round(v, 4) for k, v in res.items() if k != "games"}
    return out


def summarise(path: Path, seeds: Collection[int] | None = None) -> dict[str, Any]:
    """Success over every episode of a results file (of ``seeds``), and per seed."""
    rows = _rows(path, seeds)
    seeds = sorted({r["seed"] for r in rows})
    per_seed = {
        str(s): sum(r["success"] for r in rows if r["seed"] == s)
        / sum(r["seed"] == s for r in rows)
        for s in seeds
    }
    return {
        "success": sum(r["success"] for r in rows) / len(rows),
        "per_seed": per_seed,
        "episodes": len(rows),
        "games": len({r["task_id"] for r in rows}),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    parser = bench_parser("bench.task_scarcity", __doc__)
    parser.add_argument(
        "--budgets",
        default="8,16,24,32,64,0",
        help="real train tasks per run, comma-separated (0 = all of them)",
    )
    parser.add_argument(
        "--seeds",
        default="0,1,2",
        help="training seeds per arm, comma-separated; seeds an arm lacks are trained and "
        "added to its results (e.g. 0,1,2,3,4,5 after a 3-seed run)",
    )
    parser.add_argument("--suite", type=Path, default=SUITE, help="the selection suite")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON goes")
    parser.add_argument(
        "--compare-to",
        default="",
        metavar="TAG",
        help="also pair each arm with the results kept as scarce<budget>_<arm>_<TAG>.jsonl "
        "(e.g. an older code's arms, renamed before retraining); an arm without one is skipped",
    )
    args = parser.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(
            f"--budgets {args.budgets!r} / --seeds {args.seeds!r}: expected integers, e.g. 16,32"
        ) from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds {args.seeds!r}: distinct training seeds >= 0, e.g. 0,1,2")
    if any(b < 0 for b in budgets):
        raise SystemExit(f"--budgets {args.budgets!r}: a budget is >= 0 (0 = all tasks)")

    from components.cli_process import offline_and_quiet
    from components.config import load_config
    from components.tracking import git_commit

    offline_and_quiet()
    root = Path.cwd()
    cfg = load_config(root / "params.yaml")
    if cfg.env.name != "textworld":
        raise SystemExit(f"the selection suite is TextWorld's; env is {cfg.env.name}")
    if not (args.suite / "data" / "tasks" / "tasks.jsonl").is_file():
        raise SystemExit(f"no suite at {args.suite}: run `python -m bench.selection generate`")
    # the code that measured it: this checkout (the project may be an older run's)
    sha, dirty = git_commit(Path(__file__).resolve().parents[1], params_ok=True)
    rows: dict[str, Any] = {}
    by_budget: dict[str, dict[str, Cells]] = {}
    for budget in budgets:
        files = {arm: arm_result(cfg, root, args.suite, budget, arm, seeds) for arm in ARMS}
        row: dict[str, Any] = {arm: summarise(f, seeds) for arm, f in files.items()}
        arm_cells = {arm: cells(f, seeds) for arm, f in files.items()}
        for a, b in PAIRS:
            res = paired(arm_cells[a], arm_cells[b])
            row[f"{a}_vs_{b}"] = {k: round(v, 4) for k, v in res.items() if k != "games"}
        if args.compare_to:
            row.update(compare_to(args.suite, budget, files, args.compare_to, seeds))
        key = "all" if budget == 0 else str(budget)
        rows[key], by_budget[key] = row, arm_cells
        line = ", ".join(f"{arm} {100 * row[arm]['success']:.1f}" for arm in ARMS)
        print(f"{budget or 'all'} real tasks: {line}", flush=True)
    # one verdict per pair over the scarce budgets (all games is the default run's case)
    scarce = [k for k in by_budget if k != "all"]
    over = {}
    if len(scarce) > 1:
        for a, b in PAIRS:
            over[f"{a}_vs_{b}"] = pooled({k: (by_budget[k][a], by_budget[k][b]) for k in scarce})
            d = over[f"{a}_vs_{b}"]
            print(
                f"{a} - {b} over {len(scarce)} scarce budgets: {100 * d['diff']:+.1f} "
                f"(95% CI {100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f})",
                flush=True,
            )
    result = {
        "what": "DreamGym GRPO success on the selection suite (fresh games, never test), "
        "by real train task budget; paired differences per game and training seed with a 95% "
        "CI by bootstrap over games and seeds",
        "seeds": list(seeds),
        "passes": "sampled x3",
        "budgets": rows,
        "pooled_over_scarce_budgets": {"budgets": scarce, **over} if over else None,
        "_provenance": {"git_commit": sha, "dirty": dirty, "profile": cfg.profile},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
