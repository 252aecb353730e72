"""Stage theorem1: Theorem 1's terms per DreamGym RL round, measured -> metrics/theorem1.json.

For each DreamGym run (``theorem1.algos``) and each policy update pi_{k-1} -> pi_k whose
policy also played a round (k = 1 .. R-1 of R rounds; round k's episodes are pi_k's):

    surrogate gain  J_syn(pi_k) - J_syn(pi_{k-1}): synthetic success of rounds k and k-1
    KL              the update's ``policy_kl`` (KL(pi_{k-1} || pi_k) on pi_{k-1}'s tokens)
    eps_R, eps_P    round k's synthetic transitions (pi_k's own states) replayed in the real
                    simulator (the grounded judge's replay), ``max_trajectories`` of them
    H               round k's mean episode length
    real gain       J_real(pi_k) - J_real(pi_{k-1}): the snapshots of train_dreamgym
                    (``theorem1.snapshots``) run greedily on the real ``theorem1.split`` tasks
                    (validation by default: the test split stays held out for Table 1)

Real steps taken here are evaluation, counted in ``eval_real_steps``; the DreamGym policy
never trained on them. Curriculum-generated tasks have no real game: their synthetic
transitions cannot be replayed and are left out of eps_R / eps_P (``n_generated_skipped``).
"""

from __future__ import annotations

import logging
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.schema import Task, Trajectory, read_jsonl
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")

THEOREM1_METRICS = "theorem1.json"


def _snapshot_rounds(snap_dir: Path) -> dict[int, Path]:
    return {int(f.stem.split("-")[1]): f for f in snap_dir.glob("iter-*.pt")}


def _round_sample(trajs: Sequence[Trajectory], k: int, n: int, seed: int) -> list[Trajectory]:
    """A seeded sample of at most ``n`` synthetic trajectories of round ``k``."""
    pool = sorted(
        (t for t in trajs if t.steps and t.steps[0].provenance.iteration == k),
        key=lambda t: t.episode_id,
    )
    random.Random(f"{seed}-theorem1-{k}").shuffle(pool)
    return pool[:n]


def real_success(
    cfg: Config, paths: Paths, sft_dir: Path, snaps: dict[int, Path], tasks: list[Task]
) -> dict[int, dict[str, Any]]:
    """Greedy real success of every snapshot pi_k on ``tasks`` (k -> eval summary)."""
    from components.agent.evaluate import evaluate
    from components.agent.loading import Acting, load_policy
    from components.agent.train import load_snapshot
    from components.envs import env_factory

    e = cfg.agent.eval
    policy = load_policy(sft_dir, cfg.agent)
    actor = Acting(policy, 0.0, e.max_new_tokens)
    out: dict[int, dict[str, Any]] = {}
    make = env_factory(cfg.env, paths.root)  # shared: each snapshot restarts the same games
    for k in sorted(snaps):
        load_snapshot(policy, snaps[k])
        result = evaluate(
            actor,
            tasks,
            make,
            seeds=(cfg.seed,),
            greedy=True,
            parallel=e.parallel_envs,
        )
        out[k] = result.summary()
        log.info(
            "theorem1: pi_%d real success %.3f on %d episodes",
            k,
            out[k]["success"],
            out[k]["episodes"],
        )
    return out


def measure_job(cfg: Config, paths: Paths, algo: str) -> tuple[list[Any], dict[str, Any]]:
    """Worker: ``measure_run`` of ``algo`` with its own real env and task table."""
    from components.envs import make_env
    from components.stages.data import load_tasks

    tasks = {t.task_id: t for t in load_tasks(paths)}
    env = make_env(cfg.env, paths.root)
    try:
        return measure_run(cfg, paths, algo, env, tasks)
    finally:
        env.close()


def measure_run(
    cfg: Config, paths: Paths, algo: str, env: Any, tasks: dict[str, Task]
) -> tuple[list[Any], dict[str, Any]]:
    """(IterationTerms per update, run extras) of one DreamGym run (its first seed)."""
    from components.artifacts import (
        SFT,
        dreamgym_method,
        history_file,
        policy_dir,
        snapshots_dir,
        synthetic_file,
    )
    from components.evaluation.judge import GroundedJudge
    from components.evaluation.theorem1 import IterationTerms, model_errors
    from components.stages.rl_seed import read_history

    t1 = cfg.theorem1
    method = dreamgym_method(algo)
    # one run is measured: the first seed the method trained (rl.<algo>.seeds may be a subset)
    seed = cfg.seeds_of(method)[0]
    history = [r for r in read_history(history_file(paths, method)) if r.get("seed", seed) == seed]
    if not history:
        raise FileNotFoundError(f"no training history of {method}: run train_dreamgym")
    n_rounds = len(history) if t1.max_rounds is None else min(len(history), t1.max_rounds)
    trajs = [
        t
        for t in read_jsonl(synthetic_file(paths, algo), Trajectory)
        if t.steps and (t.steps[0].provenance.checkpoint or "").startswith(f"seed-{seed}/")
    ]
    snaps = {
        k: f
        for k, f in _snapshot_rounds(snapshots_dir(paths, method, seed)).items()
        if k < n_rounds
    }
    real_tasks = [t for t in tasks.values() if t.split == t1.split and not t.generated]
    real = {}
    if snaps and real_tasks:
        sft = policy_dir(paths, SFT, seed)
        real = real_success(cfg, paths, sft, snaps, real_tasks)
    judge = GroundedJudge(env, tasks, cfg.judge)
    records, skipped = [], 0
    for k in range(1, n_rounds):
        sample = _round_sample(trajs, k, t1.max_trajectories, cfg.seed)
        generated = [t for t in sample if t.task_id in tasks and tasks[t.task_id].generated]
        skipped += len(generated)  # no real game: the judge cannot replay them
        errors = model_errors(judge.judge(sample).transitions)
        if errors["eps_R"] is None:
            log.warning("theorem1: %s round %d has no replayable transition", method, k)
            continue
        gain = None
        if k in real and k - 1 in real:
            gain = real[k]["success"] - real[k - 1]["success"]
        records.append(
            IterationTerms(
                iteration=k,
                surrogate_gain=history[k]["success_rate"] - history[k - 1]["success_rate"],
                kl=max(0.0, float(history[k - 1].get("policy_kl", 0.0))),
                eps_R=errors["eps_R"],
                eps_P=errors["eps_P"],
                eps_P_f1=errors["eps_P_f1"],
                horizon=max(1.0, float(history[k].get("mean_turns", 1.0))),
                real_gain=gain,
            )
        )
    extras = {
        "seed": seed,
        "rounds": len(history),
        "rounds_measured": n_rounds,
        "real_split": t1.split,
        "real_episodes_per_policy": next(iter(real.values()))["episodes"] if real else 0,
        "real_success": {str(k): v["success"] for k, v in sorted(real.items())},
        "eval_real_steps": sum(v.get("eval_real_steps", 0) for v in real.values()),
        "n_generated_skipped": skipped,
        "snapshots": len(snaps),
    }
    return records, extras


def theorem1(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage theorem1: every term of the bound per round of each DreamGym run."""
    from components.artifacts import dreamgym_method
    from components.evaluation.theorem1 import FORMULA, PNG_NAME, plot_runs, summarize
    from components.stages.parallel import run_jobs
    from components.tracking import run_provenance, stage_run

    doc: dict[str, Any] = {"formula": FORMULA, "runs": {}}
    records_by_run: dict[str, list[Any]] = {}
    data = {"tasks": paths.tasks_file}
    algos = list(cfg.theorem1.algos)
    with stage_run("theorem1", "evaluation", cfg, ("theorem1",), paths.root, data) as run:
        # the runs are independent (each replays its own rounds and evaluates its snapshots)
        jobs = [(cfg, paths, algo) for algo in algos]
        for algo, (records, extras) in zip(
            algos, run_jobs(measure_job, jobs, cfg.theorem1.workers), strict=True
        ):
            method = dreamgym_method(algo)
            records_by_run[method] = records
            doc["runs"][method] = {**summarize(records), **extras}
            for r in doc["runs"][method]["iterations"]:
                run.log_metrics(
                    {f"{method}.{k}": v for k, v in numbers(r).items() if k != "iteration"},
                    step=r["iteration"],
                )
        with tempfile.TemporaryDirectory() as tmp:  # reports/theorem1.png is the report's
            png = plot_runs(records_by_run, Path(tmp) / PNG_NAME, cfg.report.dpi)
            if png is not None:
                run.log_artifact(png, "theorem1")
        run.log_dict(doc, "theorem1/theorem1.json")
    # which run the terms are of (as metrics/fidelity.json and table1.json record theirs)
    doc["_provenance"] = run_provenance(paths.root, cfg.profile, cfg.env.name)
    write_json(paths.metrics / THEOREM1_METRICS, doc)
    for method, r in doc["runs"].items():
        log.info(
            "theorem1 %s: %d updates measured, bound held in %d of %d with a real gain",
            method,
            r["n_iterations"],
            r["n_bound_holds"],
            r["n_with_real_gain"],
        )
    return {m: {k: v for k, v in r.items() if k != "iterations"} for m, r in doc["runs"].items()}
