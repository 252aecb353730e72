"""Agent RL stages: GRPO / PPO in the real env, in DreamGym's synthetic env, and sim-to-real.

    train_rl_real   models/policy/sft             -> real train-split games      -> <algo>_real
    train_dreamgym  models/policy/sft             -> synthetic env only (0 real) -> dreamgym_<algo>
    train_s2r       models/policy/dreamgym_<algo> -> real games, capped          -> s2r_<algo>
                    (reground: capped real probes refit the dream, then RL in it)

Each stage trains both algorithms: every seed of ``rl.<algo>.seeds`` (default
``agent.seeds``; each from the same seed of its start policy) in a worker process
(``rl_seed``, components/stages/rl_seed.py), all of them in one pool, so PPO's single
seed runs beside GRPO's three instead of alone on one core in a stage of its own; a
seed's run does not depend on what runs beside it (``--algo`` trains one algorithm). The
worker runs ``components.agent.train.train_rl``: rounds of batched rollouts, each followed
by one GRPO/PPO update of several minibatch epochs; its checkpoints under
``models/checkpoints/policy/<method>/seed-<s>`` let a killed run resume. The stage writes
``models/policy/<method>/seed-<s>``, the training summary ``metrics/agent/<method>.json``
(per seed and mean), the per-round history ``metrics/history/<method>.jsonl`` (rows carry
their seed), logs one nested MLflow run per seed with its per-round curves, and registers
the first seed's policy.

Real GRPO/PPO draw their task batches by reward variance (``rl.<algo>.task_sampling``);
DreamGym uses the curriculum (components/stages/dreamgym.py). Sim-to-real caps its real
steps EXACTLY at floor(rl.s2r_real_fraction x the real steps the same seed's
<algo>_real used): ``CappedEnvList`` refuses the steps past the cap and the episodes it
cuts are not trained on. ``rl.s2r_mode: reground`` spends them on probe rollouts that
re-ground the experience model, then continues the policy in that dream
(components/stages/regrounding.py); ``real_rl`` runs GRPO/PPO on the real games. A run
that ends with no optimizer update fails instead of writing a model that is only its start.
Held-out test tasks are never trained on.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from typing import Any

from components.artifacts import (
    ALGOS,
    DREAMGYM,
    REAL,
    S2R,
    SFT,
    agent_metrics_file,
    checked_algo,
    coevolved_dir,
    dreamgym_method,
    history_file,
    history_plot_file,
    method_of,
    policy_dir,
    synthetic_dir,
    synthetic_file,
)
from components.config import Config, Paths
from components.schema import Trajectory, read_jsonl, write_jsonl
from components.stages.agent import log_seeds, register, seed_summary
from components.stages.common import numbers, write_json
from components.stages.rl_seed import REGROUND, rl_seed

log = logging.getLogger("dreamgym")

_SECTIONS = ("agent", "rl", "env")
__all__ = ["train_dreamgym", "train_rl_real", "train_s2r"]


def _rl_stage(cfg: Config, paths: Paths, algos: tuple[str, ...], kind: str) -> dict[str, Any]:
    """Every seed of every algorithm in ``algos`` in one pool of worker processes; each
    algorithm logged, registered and summarised on its own.

    With several algorithms the stage has one MLflow run and each algorithm a nested one
    (``<stage>@<algo>``, its seeds nested below); with one, its run is the stage's.
    """
    from components.stages.parallel import run_jobs
    from components.tracking import stage_run

    start = time.perf_counter()
    stage = {REAL: "train_rl_real", DREAMGYM: "train_dreamgym", S2R: "train_s2r"}[kind]
    seeds = {a: cfg.seeds_of(method_of(kind, a)) for a in algos}
    inits = {a: dreamgym_method(a) if kind == S2R else SFT for a in algos}
    single = len(algos) == 1
    data = {"tasks": paths.tasks_file}
    for a in algos:
        data["init_policy" if single else f"init_policy_{a}"] = policy_dir(paths, inits[a])
    sections: tuple[str, ...] = _SECTIONS
    if kind == DREAMGYM or (kind == S2R and cfg.rl.s2r_mode == REGROUND):
        sections = (*_SECTIONS, "synthetic", "curriculum", "ablation", "buffer")
        data["trajectories"] = paths.trajectories_file
    name = f"{stage}@{algos[0]}" if single else stage
    summaries: dict[str, dict[str, Any]] = {}
    with stage_run(name, "agent", cfg, sections, paths.root, data) as run:
        # the algorithm with the fewest seeds (PPO's one) first: in one pool its seed runs
        # beside the others' instead of alone on one core in a stage of its own
        jobs = sorted(
            ((cfg, paths, a, kind, s) for a in algos for s in seeds[a]),
            key=lambda job: len(seeds[job[2]]),
        )
        done = dict(
            zip(
                ((job[2], job[4]) for job in jobs),
                run_jobs(rl_seed, jobs, cfg.agent.workers),
                strict=True,
            )
        )
        wall = round(time.perf_counter() - start, 2)
        for a in algos:
            results = {s: done[(a, s)] for s in seeds[a]}
            if single:
                summaries[a] = _log_method(run, cfg, paths, stage, a, kind, results, wall)
                continue
            with run.child(f"{stage}@{a}") as child:
                summaries[a] = _log_method(child, cfg, paths, stage, a, kind, results, wall)
    out = {}
    for a, summary in summaries.items():
        version = summary.pop("registered_version")
        method = method_of(kind, a)
        write_json(agent_metrics_file(paths, method), summary)
        log.info("%s trained (%d seeds): %s", method, len(seeds[a]), numbers(summary))
        out[method] = {**summary, "registered_version": version}
    return out[method_of(kind, algos[0])] if single else out


def _log_method(
    run: Any,
    cfg: Config,
    paths: Paths,
    stage: str,
    algo: str,
    kind: str,
    results: dict[int, dict[str, Any]],
    wall: float,
) -> dict[str, Any]:
    """One algorithm's seeds: curves, history files, datasets, metrics, registered policy."""
    method = method_of(kind, algo)
    seeds = sorted(results)
    init = dreamgym_method(algo) if kind == S2R else SFT
    run.set_tags({"method": method, "algorithm": algo, "init": init})
    # MLflow curves only (the history files stay as they were): the constant policy lr
    curves = {
        s: {**r, "history": [dict(row, lr=_policy_lr(cfg, algo)) for row in r["history"]]}
        for s, r in results.items()
    }
    log_seeds(run, f"{stage}@{algo}", curves, "iteration")
    history = [row for s in seeds for row in results[s]["history"]]
    summary = {**seed_summary(results), "stage": stage, "wall_seconds": wall}
    hist_path = history_file(paths, method)
    hist_path.parent.mkdir(parents=True, exist_ok=True)
    hist_path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in history))
    write_json(history_plot_file(paths, method), history)
    if kind == DREAMGYM:
        merged = [t for s in seeds for t in read_jsonl(synthetic_file(paths, algo, s), Trajectory)]
        write_jsonl(synthetic_file(paths, algo), merged)
        shutil.rmtree(synthetic_dir(paths) / method, ignore_errors=True)
        run.log_dataset(synthetic_file(paths, algo), "synthetic-trajectories", "synthetic")
        for s in seeds:  # the co-evolved buffer snapshot of each seed (not hashed: GBs)
            run.log_dataset(coevolved_dir(paths, algo, s), f"buffer-seed-{s}", "buffer")
    run.log_metrics(numbers(summary))
    run.log_artifact(hist_path, "history")
    version = register(
        run,
        cfg,
        policy_dir(paths, method, seeds[0]),
        method,
        {"init": init, "real_steps": summary.get("real_steps", 0)},
    )
    return {**summary, "registered_version": version}


def _policy_lr(cfg: Config, algo: str) -> float:
    """The policy's learning rate (constant: no schedule) for the per-round MLflow curves."""
    return float(getattr(cfg.rl, checked_algo(algo)).learning_rate)


def _algos(algo: str | None) -> tuple[str, ...]:
    return ALGOS if algo is None else (checked_algo(algo),)


def train_rl_real(cfg: Config, paths: Paths, algo: str | None = None) -> dict[str, Any]:
    """Stage train_rl_real: RL from each seed's SFT policy on real train games (every
    algorithm, their seeds in one worker pool; ``algo``: that one only, its summary)."""
    return _rl_stage(cfg, paths, _algos(algo), REAL)


def train_dreamgym(cfg: Config, paths: Paths, algo: str | None = None) -> dict[str, Any]:
    """Stage train_dreamgym: RL from each seed's SFT policy in the synthetic env only
    (every algorithm in one worker pool, or ``algo`` only)."""
    return _rl_stage(cfg, paths, _algos(algo), DREAMGYM)


def train_s2r(cfg: Config, paths: Paths, algo: str | None = None) -> dict[str, Any]:
    """Stage train_s2r: each seed's DreamGym policy continues in the real env, capped
    (every algorithm in one worker pool, or ``algo`` only)."""
    return _rl_stage(cfg, paths, _algos(algo), S2R)
