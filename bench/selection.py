"""A selection suite: fresh games to choose settings on, never the test games.

The pipeline's validation split is 29 games: a 2-point difference between two settings is
noise there. This tool generates a larger suite of new games (another generator seed, so
none of them is a train, validation or test game of the project), evaluates the project's
policies on it, retrains an S2R or DreamGym variant with overridden settings, and compares
two results paired per game and training seed, with a 95% CI that resamples both. The
README's selection tables were made with it. Run it from a project root after
``make run`` (the TextWorld cpu profile):

    python -m bench.selection generate                      # ~2 min: 150 games
    python -m bench.selection evaluate grpo_real            # the run's real GRPO policies
    python -m bench.selection retrain s2r_x --set rl.s2r_explore=true
    python -m bench.selection compare s2r_x s2r_grpo
    python -m bench.selection show                          # every evaluation, best first

Everything lands under ``data/selection/`` (tasks, ``results/<name>.jsonl``, one row per
episode; ``results.jsonl``, one summary per evaluation); a retrained variant's policies
under ``models/policy/selection_<name>/`` beside the run's. Neither is a DVC output.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.common import bench_parser

SUITE = Path("data/selection")
RETRAINED = "selection_"  # retrained variants publish as models/policy/selection_<name>
SEEDS = (0, 1, 2)
WORKERS = 2


def overridden(cfg: Any, assignments: Sequence[str]) -> Any:
    """``cfg`` with ``section.key=json-value`` assignments applied (a one-line error if bad)."""
    for item in assignments:
        dotted, sep, raw = item.partition("=")
        *sections, key = dotted.split(".")
        if not sep or not sections:
            raise SystemExit(
                f"--set {item!r}: expected section.key=value, e.g. rl.s2r_explore=true"
            )
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare string
        parents = [cfg]
        for name in sections:
            if not hasattr(parents[-1], name):
                raise SystemExit(f"--set {item!r}: the config has no section {name!r}")
            parents.append(getattr(parents[-1], name))
        if key not in type(parents[-1]).model_fields:
            raise SystemExit(f"--set {item!r}: {'.'.join(sections)} has no setting {key!r}")
        try:
            node = parents[-1].model_validate({**parents[-1].model_dump(), key: value})
        except ValueError as err:  # pydantic's ValidationError: its first error's message
            errors = getattr(err, "errors", None)
            detail = errors()[0]["msg"] if errors else str(err).splitlines()[0]
            raise SystemExit(f"--set {item!r}: {detail}") from None
        for parent, name in zip(reversed(parents[:-1]), reversed(sections), strict=True):
            node = parent.model_copy(update={name: node})
        cfg = node
    return cfg


def generate(cfg: Any, root: Path, suite: Path, seed: int, games: dict[str, int]) -> list[Any]:
    """Generate the suite's games (all held out) with generator ``seed``; drop the project's."""
    from components.config import Paths
    from components.envs.textworld_tasks import generate_task_suite
    from components.schema import write_jsonl
    from components.stages.data import load_tasks

    if seed == cfg.seed:
        raise SystemExit(f"--seed {seed} is the project's own generator seed: pick another")
    unknown = set(games) - {f.name for f in cfg.tasks.families}
    if unknown:
        raise SystemExit(f"--games names {sorted(unknown)}: not task families of params.yaml")
    families = [
        f.model_copy(update={"n_games": games[f.name]})
        for f in cfg.tasks.families
        if games.get(f.name)
    ]
    no_fit = cfg.tasks.split.model_copy(update={"train": 0.0, "validation": 0.0})
    tasks_cfg = cfg.tasks.model_copy(update={"families": families, "split": no_fit})
    suite_cfg = cfg.model_copy(update={"seed": seed, "tasks": tasks_cfg})
    # game files are relative to the suite's root: evaluation runs there (Paths(suite))
    tasks = generate_task_suite(suite_cfg, suite / "data" / "tasks", root=suite)
    own = {t.task_id for t in load_tasks(Paths(root))}
    kept = [t for t in tasks if t.task_id not in own]
    write_jsonl(suite / "data" / "tasks" / "tasks.jsonl", kept)
    return kept


def evaluate(
    cfg: Any,
    root: Path,
    suite: Path,
    name: str,
    method: str,
    seeds: Sequence[int] = SEEDS,
    keep_other_seeds: bool = False,
) -> dict[str, Any]:
    """``seeds`` of ``models/policy/<method>`` on the suite's held-out games, sampled passes;
    ``keep_other_seeds``: the results' rows of other seeds stay (adding seeds to a result)."""
    from components.config import Paths
    from components.stages.agent import eval_job
    from components.stages.parallel import run_jobs

    method_dir = root / "models" / "policy" / method
    if not method_dir.is_dir():
        raise SystemExit(f"no policy at {method_dir}: run `make run` (or retrain) first")
    jobs = [(cfg, Paths(suite), method, s, ("sampled",), method_dir) for s in seeds]
    rows = [r for rs in run_jobs(eval_job, jobs, WORKERS) for r in rs]
    out = suite / "results" / f"{name}.jsonl"
    if keep_other_seeds and out.is_file():
        kept = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        rows = [r for r in kept if r["seed"] not in set(seeds)] + rows
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out)
    per_seed = {
        s: [r["success"] for r in rows if r["seed"] == s] for s in sorted({r["seed"] for r in rows})
    }
    summary = {
        "name": name,
        "method": method,
        "success": sum(r["success"] for r in rows) / len(rows),
        "per_seed": {s: sum(v) / len(v) for s, v in per_seed.items() if v},
        "episodes": len(rows),
    }
    with (suite / "results.jsonl").open("a") as f:
        f.write(json.dumps(summary) + "\n")
    return summary


def retrain(
    cfg: Any, root: Path, name: str, kind: str, algo: str, seeds: Sequence[int] = SEEDS
) -> list[dict[str, Any]]:
    """Each of ``seeds``' ``kind`` run (s2r / dreamgym) on the project, as selection_<name>."""
    from components.artifacts import DREAMGYM, S2R
    from components.config import Paths
    from components.stages.parallel import run_jobs
    from components.stages.rl_seed import rl_seed

    kinds = {"s2r": S2R, "dreamgym": DREAMGYM}
    jobs = [(cfg, Paths(root), algo, kinds[kind], s, None, RETRAINED + name) for s in seeds]
    return run_jobs(rl_seed, jobs, WORKERS)


def sft_starts(cfg: Any, root: Path, seeds: Sequence[int]) -> list[int]:
    """Train the SFT policy (the RL runs' start) of each of ``seeds`` the project lacks,
    as the train_sft stage would; the seeds trained."""
    from components.agent.loading import is_policy_dir
    from components.agent.scorer_training import expert_steps
    from components.artifacts import SFT, policy_dir
    from components.config import Paths
    from components.stages.agent import load_trajectories, sft_seed
    from components.stages.parallel import run_jobs

    paths = Paths(root)
    missing = [s for s in seeds if not is_policy_dir(policy_dir(paths, SFT, s))]
    if missing:
        trajectories = load_trajectories(paths)
        demos, _ = expert_steps(trajectories)
        held_out, _ = expert_steps(trajectories, split="validation")
        jobs = [(cfg, paths, s, demos, held_out) for s in missing]
        run_jobs(sft_seed, jobs, WORKERS)
    return missing


def paired(
    a: dict[str, dict[int, float]], b: dict[str, dict[int, float]], seed: int = 0
) -> dict[str, Any]:
    """Mean difference a - b over shared (game, training seed) cells, with a 95% CI that
    resamples games and seeds (a rerun trains other seeds: their spread is part of it)."""
    from components.agent.table1 import DIFFERENCE, crossed_bootstrap

    diffs = {g: {s: a[g][s] - b[g][s] for s in a[g] if s in b[g]} for g in sorted(set(a) & set(b))}
    diffs = {g: d for g, d in diffs.items() if d}
    if not diffs:
        raise SystemExit("the two results share no (game, seed)")
    flat = [v for d in diffs.values() for v in d.values()]
    low, high = crossed_bootstrap(diffs, seed=seed, bounds=DIFFERENCE)
    return {"diff": sum(flat) / len(flat), "ci_low": low, "ci_high": high, "games": len(diffs)}


def per_game(path: Path) -> dict[str, dict[int, float]]:
    """task_id -> training seed -> its episodes' mean success, from a results file."""
    if not path.exists():
        raise SystemExit(f"no results at {path}: run `python -m bench.selection evaluate` first")
    return per_game_rows(json.loads(line) for line in path.read_text().splitlines())


def per_game_rows(rows: Iterable[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """task_id -> training seed -> mean success of those episode rows."""
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        cells[row["task_id"]][int(row["seed"])].append(float(row["success"]))
    return {g: {s: sum(v) / len(v) for s, v in seeds.items()} for g, seeds in cells.items()}


def table(summaries: Path) -> str:
    """A markdown table of the latest evaluation per name, best first."""
    if not summaries.exists():
        raise SystemExit(f"no evaluations at {summaries}: run `python -m bench.selection evaluate`")
    latest = {}
    for line in summaries.read_text().splitlines():
        row = json.loads(line)
        latest[row["name"]] = row
    lines = ["| name | policies | success % | per seed | episodes |", "|---|---|---|---|---|"]
    for row in sorted(latest.values(), key=lambda r: -r["success"]):
        seeds = " / ".join(f"{100 * v:.1f}" for v in row["per_seed"].values())
        cells = [row["name"], row.get("method", ""), f"{100 * row['success']:.1f}", seeds]
        lines.append("| " + " | ".join([*cells, str(row.get("episodes", ""))]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    parser = bench_parser("bench.selection", __doc__)
    parser.add_argument("--suite", type=Path, default=SUITE, help="where the suite lives")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate the suite's games")
    gen.add_argument("--seed", type=int, default=7, help="generator seed (not the project's)")
    gen.add_argument(
        "--games",
        default="quest=60,treasure=90",
        help="games per task family, family=n,... (families of params.yaml's tasks)",
    )
    ev = sub.add_parser("evaluate", help="evaluate a method's policies on the suite")
    ev.add_argument("name", help="the results' name (data/selection/results/<name>.jsonl)")
    ev.add_argument(
        "--method", help="models/policy/<method> (default: name, else selection_<name>)"
    )
    rt = sub.add_parser("retrain", help="retrain S2R or DreamGym with --set overrides, evaluate")
    rt.add_argument("name", help="publish the policies as models/policy/selection_<name>")
    rt.add_argument("--kind", choices=["s2r", "dreamgym"], default="s2r")
    rt.add_argument("--algo", choices=["grpo", "ppo"], default="grpo")
    rt.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a params.yaml setting (JSON value), e.g. rl.s2r_dream_iterations=144",
    )
    cmp = sub.add_parser("compare", help="paired difference of two results over shared games")
    cmp.add_argument("a")
    cmp.add_argument("b")
    sub.add_parser("show", help="every evaluation so far, best first (the latest per name)")
    args = parser.parse_args(argv)

    root = Path.cwd()
    if args.command == "show":
        print(table(args.suite / "results.jsonl"))
        return
    if args.command == "compare":
        results = args.suite / "results"
        res = paired(per_game(results / f"{args.a}.jsonl"), per_game(results / f"{args.b}.jsonl"))
        print(
            f"{args.a} - {args.b}: {100 * res['diff']:+.1f} points "
            f"(95% CI {100 * res['ci_low']:+.1f}, {100 * res['ci_high']:+.1f}) "
            f"over {res['games']} games"
        )
        return
    from components.cli_process import offline_and_quiet
    from components.config import load_config

    offline_and_quiet()  # as the stages run: offline, no library log noise
    cfg = load_config(root / "params.yaml")
    if cfg.env.name != "textworld":
        raise SystemExit(f"the selection suite generates TextWorld games; env is {cfg.env.name}")
    start = time.perf_counter()
    if args.command == "generate":
        games = dict(item.split("=") for item in args.games.split(","))
        tasks = generate(cfg, root, args.suite, args.seed, {k: int(v) for k, v in games.items()})
        played = sum(t.split == "test" for t in tasks)  # the generator keeps 1 per family in train
        print(f"{len(tasks)} games in {args.suite / 'data' / 'tasks'}, {played} to evaluate on")
        return
    if args.command == "retrain":
        cfg = overridden(cfg, args.set)
        runs = retrain(cfg, root, args.name, args.kind, args.algo)
        steps = [r.get("real_steps") for r in runs]
        print(f"{args.name}: trained {len(runs)} seeds, real steps {steps}")
    method = getattr(args, "method", None) or args.name
    if args.command == "retrain" or not (root / "models" / "policy" / method).is_dir():
        method = RETRAINED + args.name  # a variant retrained here
    summary = evaluate(cfg, root, args.suite, args.name, method)
    per_seed = ", ".join(f"{100 * v:.1f}" for v in summary["per_seed"].values())
    print(
        f"{args.name}: {100 * summary['success']:.1f}% over {summary['episodes']} episodes "
        f"(seeds {per_seed}) in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
