"""One seed's RL run (``rl_seed``), the worker every RL stage runs in its pool.

A run of kind real, dreamgym or s2r starts from its seed's start policy (SFT, or the
DreamGym policy for S2R), builds its env (the real games, DreamGym's synthetic env, or
the real games behind ``CappedEnvList``), runs ``components.agent.train.train_rl`` (rounds
of batched rollouts, each followed by one GRPO/PPO update; checkpoints under
``models/checkpoints/policy/<method>/seed-<s>`` let a killed run resume) and publishes
``models/policy/<method>/seed-<s>``. The run's fingerprint (start policy, env, tasks, and
for a dream its experience model, buffer and settings) decides whether a checkpoint is
resumed. A run that ends with no optimizer update raises ``NoUpdateError`` instead of
writing a model that is only its start. Held-out test tasks are never trained on.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

from components.artifacts import (
    DREAMGYM,
    S2R,
    SFT,
    agent_metrics_file,
    checked_algo,
    coevolved_dir,
    dreamgym_method,
    experience_model_dir,
    method_of,
    policy_checkpoint_dir,
    policy_dir,
    real_method,
    snapshots_dir,
    synthetic_file,
)
from components.config import Config, Paths, RLAlgoConfig
from components.envs.vector import CappedEnvList
from components.io import json_line, read_json, read_rows
from components.schema import Task, Trajectory, read_jsonl, seed_int, write_jsonl
from components.stages.common import numbers, write_json

TRAIN_SPLIT = "train"
REGROUND, REAL_RL = "reground", "real_rl"  # rl.s2r_mode: re-ground the dream | real GRPO/PPO


class NoUpdateError(RuntimeError):
    """An RL run made no optimizer update: its "trained" policy would be its start."""

    def __init__(self, message: str, real_steps: int = 0) -> None:
        super().__init__(message)
        self.real_steps = real_steps  # what the run spent on the real env all the same


def _train_tasks(paths: Paths) -> list[Task]:
    """The real train-split tasks (never validation or test)."""
    from components.stages.data import load_tasks

    tasks = [t for t in load_tasks(paths) if t.split == TRAIN_SPLIT and not t.generated]
    if not tasks:
        from components.io import InputError

        raise InputError(f"{paths.tasks_file} has no train-split task: rerun generate-tasks")
    return tasks


def algo_config(cfg: Config, algo: str, kind: str, seed: int) -> RLAlgoConfig:
    """``rl.<algo>`` for one run: its seed, and DreamGym's / S2R's own round settings."""
    update: dict[str, Any] = {"seed": seed}
    if kind == DREAMGYM and cfg.rl.dreamgym_iterations is not None:
        update["iterations"] = cfg.rl.dreamgym_iterations
    if kind == DREAMGYM and cfg.rl.dreamgym_tasks_per_iteration is not None:
        update["tasks_per_iteration"] = cfg.rl.dreamgym_tasks_per_iteration
    if kind == S2R and cfg.rl.s2r_tasks_per_iteration is not None:
        update["tasks_per_iteration"] = cfg.rl.s2r_tasks_per_iteration
    if kind == S2R and cfg.rl.s2r_aggregation is not None:
        update["aggregation"] = cfg.rl.s2r_aggregation
    return getattr(cfg.rl, checked_algo(algo)).model_copy(update=update)


def s2r_cap(cfg: Config, paths: Paths, algo: str, seed: int) -> tuple[int, int]:
    """(cap, reference): floor(fraction x the real steps ``<algo>_real`` seed used)."""
    ref_file = agent_metrics_file(paths, real_method(algo))
    if not ref_file.exists():
        raise FileNotFoundError(f"{ref_file} missing: run `dreamgym train-rl-real --algo {algo}`")
    ref = read_json(ref_file)
    per_seed = ref.get("per_seed", {}).get(str(seed))
    if per_seed is None:
        raise FileNotFoundError(f"{ref_file} has no seed {seed}: rerun train-rl-real")
    steps = int(per_seed["real_steps"])
    return math.floor(cfg.rl.s2r_real_fraction * steps), steps


def _resume_point(out_dir: Path, algo_cfg: RLAlgoConfig, extra: dict[str, Any]) -> tuple[int, int]:
    """(rounds done, real steps used) of the run ``train_rl`` will resume; (0, 0) if none."""
    from components.agent import checkpoint
    from components.agent.train import CHECKPOINT_DIR, fingerprint_of

    last = checkpoint.prepare(out_dir / CHECKPOINT_DIR, fingerprint_of(algo_cfg, extra))
    if last is None:
        return 0, 0
    state = checkpoint.load(last)
    return int(state["iteration"]), int(state["real_steps"])


def rl_seed(
    cfg: Config,
    paths: Paths,
    algo: str,
    kind: str,
    seed: int,
    init_dir: Path | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    """Worker: one seed's RL run of ``kind`` (real, dreamgym, s2r); its results.

    ``init_dir`` / ``method``: start from another policy folder and publish under another
    method name (cross-env transfer: another env's DreamGym policy continued with S2R here).
    """
    from components.agent.loading import load_policy, publish_dir
    from components.agent.train import HISTORY_FILE, POLICY_DIR, train_rl
    from components.curriculum.sampling import VarianceTaskSampler
    from components.envs import env_factory
    from components.tracking import dvc_md5

    start = time.perf_counter()
    transfer = init_dir is not None
    method = method or method_of(kind, algo)
    init = dreamgym_method(algo) if kind == S2R else SFT
    algo_cfg = algo_config(cfg, algo, kind, seed)
    if init_dir is None:
        init_dir = policy_dir(paths, init, seed)
    else:
        init = str(init_dir)
    out_dir = policy_checkpoint_dir(paths, method, seed)
    tasks = _train_tasks(paths)
    fingerprint: dict[str, Any] = {
        "method": method,
        "init": dvc_md5(init_dir) if init_dir.exists() else "missing",
        "env": cfg.env.model_dump(mode="json"),
        "tasks": sorted(t.task_id for t in tasks),
    }
    # set before any _resume_point: a fingerprint that differs from train_rl's wipes the
    # checkpoints; a resumed run must have kept every round's weights
    snapshots = kind == DREAMGYM and cfg.theorem1.snapshots
    if snapshots:
        fingerprint["snapshots"] = True
    # fresh LoRA adapters seeded by the run's seed, not by what ran before in this worker
    policy = load_policy(init_dir, cfg.agent, trainable=True, seed=seed_int(seed, "lora"))
    extra: dict[str, Any] = {}
    run = None
    source: Any = (
        VarianceTaskSampler(tasks, seed=seed) if algo_cfg.task_sampling == "variance" else tasks
    )
    dreams = kind == DREAMGYM or (kind == S2R and cfg.rl.s2r_mode == REGROUND)
    if dreams:
        from components.stages.dreamgym import DreamGymRun

        fingerprint.update(
            {
                "experience_model": dvc_md5(experience_model_dir(paths, "full")),
                "seed_buffer": dvc_md5(paths.buffer) if paths.buffer.exists() else "missing",
                "synthetic": cfg.synthetic.model_dump(mode="json"),
                "curriculum": cfg.curriculum.model_dump(mode="json"),
                "ablation": cfg.ablation.model_dump(mode="json"),
            }
        )
        probes: list[Trajectory] = []
        exp_dir = None
        if kind == S2R:  # re-grounding: the real budget buys the dream real experience
            from components.stages.regrounding import reground

            cap, reference = s2r_cap(cfg, paths, algo, seed)
            fingerprint["real_step_cap"] = cap
            if cfg.rl.s2r_explore:
                fingerprint["explore"] = True
            probes, exp_dir, extra = reground(
                cfg, paths, policy, tasks, algo_cfg, cap=cap, seed=seed, out_dir=out_dir
            )
            extra = {"real_step_cap": cap, "reference_real_steps": reference, **extra}
            # the dream phase is a DreamGym run: its own round settings, s2r_dream_iterations
            algo_cfg = algo_config(cfg, algo, DREAMGYM, seed)
            if cfg.rl.s2r_dream_iterations is not None:
                algo_cfg = algo_cfg.model_copy(update={"iterations": cfg.rl.s2r_dream_iterations})
        resumed_at, _ = _resume_point(out_dir, algo_cfg, fingerprint)
        run = DreamGymRun(
            cfg,
            paths,
            algo=algo,
            method=method,
            seed=seed,
            tasks=tasks,
            out_dir=out_dir,
            tasks_per_iteration=algo_cfg.tasks_per_iteration,
            resumed_at=resumed_at,
            exp_dir=exp_dir,
            real=probes,
        )
        env: Any = run.env
        source = run.tasks_for
    elif kind == S2R:
        cap, reference = s2r_cap(cfg, paths, algo, seed)
        algo_cfg = algo_cfg.model_copy(update={"max_real_steps": cap})
        fingerprint["real_step_cap"] = cap
        # the task prior comes from this env's DreamGym run: not what a transferred policy saw
        prior = cfg.rl.s2r_task_prior == "synthetic" and not transfer
        prior = prior and isinstance(source, VarianceTaskSampler)
        if prior:  # before _resume_point: a partial fingerprint would wipe the checkpoints
            fingerprint["task_prior"] = cfg.rl.s2r_task_prior
        _, used = _resume_point(out_dir, algo_cfg, fingerprint)
        env = CappedEnvList(env_factory(cfg.env, paths.root), budget=cap - used)
        extra = {"real_step_cap": cap, "reference_real_steps": reference}
        if prior:
            extra["prior_tasks"] = synthetic_prior(source, synthetic_file(paths, algo), seed)
    else:
        env = env_factory(cfg.env, paths.root)  # a factory: the env list grows as needed
    summary = train_rl(
        policy,
        env,
        source,
        algo_cfg,
        out_dir,
        on_rollouts=(lambda i, b: run.on_rollouts(i, b)) if run is not None else None,
        fingerprint=fingerprint,
        snapshots=snapshots,
        demo_loss=_demo_loss(paths, policy, algo_cfg, seed) if algo_cfg.sft_coef else None,
    )
    if kind == S2R and dreams:  # the dream phase took none: the real steps are the probes'
        summary["real_steps"] = extra["probe_real_steps"]
    if summary["optimizer_updates"] == 0:
        raise NoUpdateError(
            f"{method} seed {seed}: {summary['iterations']} rounds and no optimizer update "
            "(every group's rewards were equal?): not writing a policy that is its start",
            real_steps=int(summary["real_steps"]),
        )
    if kind == S2R and summary["real_steps"] > extra["real_step_cap"]:
        raise AssertionError(f"S2R used {summary['real_steps']} > cap {extra['real_step_cap']}")
    if kind == DREAMGYM and summary["real_steps"] != 0:
        raise AssertionError(f"DreamGym used {summary['real_steps']} real steps")
    history = [
        {k.replace(".", "_"): v for k, v in row.items()}
        for row in _read_rows(out_dir / HISTORY_FILE)
    ]
    trajectories: list[Trajectory] = []
    if run is not None:
        trajectories, extras, dreamt = run.finish(int(summary["iterations"]))
        extra = {**extra, **dreamt}
        history = [{**row, **x} for row, x in zip(history, extras, strict=True)]
    if kind == S2R and dreams:  # cumulative real steps: the probes came before every round
        history = [{**row, "real_steps": float(extra["probe_real_steps"])} for row in history]
    if run is not None and kind == DREAMGYM:  # S2R's dream is not DreamGym's output
        run.publish_buffer(coevolved_dir(paths, algo, seed))
        _publish_snapshots(out_dir, snapshots_dir(paths, method, seed), method, init)
        synth = synthetic_file(paths, algo, seed)
        write_jsonl(synth, trajectories)
    meta = {
        "method": method,
        "seed": seed,
        "algorithm": algo,
        "init": init,
        "policy": cfg.agent.policy,
        "real_steps": int(summary["real_steps"]),
        "iterations": int(summary["iterations"]),
        **{k: v for k, v in extra.items() if k in ("real_step_cap", "synthetic_steps")},
    }
    publish_dir(out_dir / POLICY_DIR, policy_dir(paths, method, seed), meta)
    shutil.rmtree(out_dir, ignore_errors=True)  # finished: the next run starts fresh
    return {
        **numbers(summary),
        **numbers(extra),
        "wall_seconds": round(time.perf_counter() - start, 2),
        "history": [dict(r, seed=seed) for r in history],
    }


def _demo_loss(paths: Paths, policy: Any, algo_cfg: Any, seed: int) -> Any:
    """The ``sft_coef`` term's loss on the train split's real expert steps (scorer only)."""
    from components.agent.scorer import ScorerPolicy
    from components.agent.scorer_training import demo_loss_fn, expert_steps

    if not isinstance(policy, ScorerPolicy):
        from components.config import ConfigError  # load_config refuses it already

        raise ConfigError("rl.<algo>.sft_coef > 0 needs agent.policy: scorer")
    demos, _ = expert_steps(read_jsonl(paths.trajectories_file, Trajectory))
    return demo_loss_fn(policy, demos, algo_cfg.sft_batch_size, seed_int(algo_cfg.seed, seed))


def synthetic_prior(sampler: Any, synthetic: Path, seed: int, weight: float = 4.0) -> int:
    """Seed ``sampler`` with each train task's success in seed ``seed``'s DreamGym episodes.

    A task's synthetic record counts as at most ``weight`` real outcomes, so a few real
    rounds overrule a dream that was wrong. Returns how many tasks got a prior.
    """
    if not synthetic.exists():
        raise FileNotFoundError(f"{synthetic} missing: run `dreamgym train-dreamgym` first")
    mark = f'"checkpoint":"seed-{seed}/'  # the run's steps carry seed-<s>/round-<i>
    outcomes: dict[str, list[int]] = {}
    with synthetic.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if mark in line:
                row = json_line(line, synthetic, n)
                outcomes.setdefault(row["task_id"], []).append(int(bool(row["success"])))
    seeded = 0
    for task_id, wins in outcomes.items():
        if task_id in sampler.stats and wins:
            n = min(float(len(wins)), weight)
            sampler.stats[task_id] = [n * sum(wins) / len(wins), n]
            seeded += 1
    return seeded


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return read_rows(path) if path.exists() else []


def _publish_snapshots(out_dir: Path, dst: Path, method: str, init: str) -> None:
    """Copy the run's per-round snapshots to their DVC output, with an index."""
    from components.agent.train import SNAPSHOT_DIR

    src = out_dir / SNAPSHOT_DIR
    shutil.rmtree(dst, ignore_errors=True)
    if src.exists():
        shutil.copytree(src, dst)
    else:  # snapshots off: an empty output, so the DVC stage still has it
        dst.mkdir(parents=True)
    rounds = sorted(int(f.stem.split("-")[1]) for f in dst.glob("iter-*.pt"))
    write_json(dst / "index.json", {"method": method, "init": init, "rounds": rounds})


def read_history(path: Path) -> list[dict[str, Any]]:
    """The per-round rows of a history file ([] if there is none)."""
    return _read_rows(path)
