"""``train_rl``: the RL training loop shared by GRPO and PPO, real or synthetic env.

Each round: pick the task batch (seeded sample of ``tasks``, or ``tasks(iteration)`` for a
curriculum), run ``rollouts_per_task`` episodes per task with all slots stepped together,
update the policy, log the round's metrics through ``log_fn(metrics, step)`` (the caller
decides where they go: the stages call components/tracking.py), and checkpoint every
``save_every`` rounds. A run stops early, after a checkpoint, once its wall-clock
(``max_train_minutes``) or real-step (``max_real_steps``; overshoot < one round) budget is
spent. A run that finds checkpoints of the same run (fingerprint) under
``out_dir/checkpoints`` resumes after the last one: same rounds, same real-step count,
same weights as an uninterrupted run. The final policy is saved to ``out_dir/policy``.
The loop reads top to bottom (tasks, rollouts, bookkeeping, update, log); resuming and
checkpointing live in ``_Checkpointing``, a thin wrapper around it.
With ``snapshots=True`` the trainable weights of every policy pi_0 (the start) .. pi_R are
also kept, as ``out_dir/snapshots/iter-<k>.pt``, for the Theorem-1 stage's real gains.

Every round also reports ``policy_kl``: KL(pi_{k-1} || pi_k) of the update, estimated on
the round's own sampled tokens (components/agent/rl.py ``update_kl``).

Every round reports ``real_steps`` (cumulative real env steps used by this training run,
counted by ``EnvList``; 0 in a synthetic env), so every method logs its real budget.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from components.agent import checkpoint
from components.agent.grpo import GRPO, GRPOConfig
from components.agent.policy_base import TrainablePolicy
from components.agent.ppo import PPO, PPOConfig
from components.agent.rl import RUNTIME_FIELDS, DemoLoss, seed_everything, seed_int, update_kl
from components.agent.rollout import RolloutBatch, collect_rollouts
from components.config import RLAlgoConfig
from components.envs.base import Env
from components.envs.vector import EnvList, VectorEnv
from components.schema import Task

log = logging.getLogger(__name__)

POLICY_DIR = "policy"
CHECKPOINT_DIR = "checkpoints"
HISTORY_FILE = "history.jsonl"
SNAPSHOT_DIR = "snapshots"
LogFn = Callable[[dict[str, float], int], None]


@runtime_checkable
class TaskSampler(Protocol):
    """A stateful task source (e.g. components/curriculum/sampling.VarianceTaskSampler)."""

    def sample(self, iteration: int, k: int) -> list[Task]:
        """The round's distinct tasks."""
        ...

    def update(self, outcomes: Sequence[tuple[str, float]]) -> None:
        """Learn from the round's (task_id, reward) outcomes."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore checkpointed state."""
        ...


TaskSource = Sequence[Task] | Callable[[int], Sequence[Task]] | TaskSampler
EnvSource = VectorEnv | Sequence[Env] | Callable[[], Env]


def make_learner(
    policy: TrainablePolicy,
    cfg: RLAlgoConfig,
    group_fn: Callable[[Task], Hashable] | None = None,
    demo_loss: DemoLoss | None = None,
) -> GRPO | PPO:
    """The learner for ``cfg``'s algorithm."""
    if isinstance(cfg, GRPOConfig):
        return GRPO(policy, cfg, demo_loss)
    if isinstance(cfg, PPOConfig):
        return PPO(policy, cfg, group_fn, demo_loss)
    raise TypeError(f"unknown RL config {type(cfg).__name__}")


def as_vector_env(env: EnvSource) -> tuple[VectorEnv, bool]:
    """(vector env, created here): a VectorEnv as is; Env lists/factories in an EnvList.

    Only envs made here from a factory are closed at the end; the caller owns the others.
    """
    if isinstance(env, VectorEnv):
        return env, False
    if callable(env):
        return EnvList(factory=env), True
    return EnvList(list(env)), False


def task_batch(
    tasks: TaskSource, iteration: int, cfg: RLAlgoConfig
) -> tuple[list[Task], list[int]]:
    """This round's episodes' tasks (each repeated ``rollouts_per_task`` times) and groups."""
    if isinstance(tasks, TaskSampler):
        distinct = list(tasks.sample(iteration, cfg.tasks_per_iteration))
    elif callable(tasks):
        distinct = list(tasks(iteration))
    else:
        pool = list(tasks)
        if not pool:
            raise ValueError("no tasks to train on")
        rng = random.Random(seed_int(cfg.seed, "tasks", iteration))
        k = cfg.tasks_per_iteration
        distinct = rng.sample(pool, k) if k <= len(pool) else rng.choices(pool, k=k)
    n = cfg.rollouts_per_task
    return (
        [t for t in distinct for _ in range(n)],
        [g for g in range(len(distinct)) for _ in range(n)],
    )


def fingerprint_of(cfg: RLAlgoConfig, extra: dict[str, Any] | None) -> dict[str, Any]:
    """What identifies a run for resuming: algorithm, config (minus runtime fields), extra."""
    fields = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in RUNTIME_FIELDS}
    return {"algorithm": type(cfg).__name__, "config": fields, "extra": extra or {}}


class _Checkpointing:
    """Resume and checkpointing around ``train_rl``'s loop (the loop itself knows nothing of it).

    ``resume()`` restores weights, learner, samplers (tasks, demonstrations) and RNG from
    the newest checkpoint of the same run (fingerprint) and returns where it stopped;
    ``after_round`` keeps the round's snapshot and writes a checkpoint every ``save_every``
    rounds and at the end.
    """

    def __init__(
        self,
        out_dir: Path,
        cfg: RLAlgoConfig,
        fingerprint: dict[str, Any] | None,
        policy: TrainablePolicy,
        learner: GRPO | PPO,
        sampler: TaskSampler | None,
        snapshots: bool,
        demo_loss: DemoLoss | None = None,
    ) -> None:
        self.out_dir, self.cfg, self.fingerprint = out_dir, cfg, fingerprint
        self.policy, self.learner, self.sampler, self.snapshots = (
            policy,
            learner,
            sampler,
            snapshots,
        )
        # a stateful behaviour-cloning term (its batch sampler) is checkpointed too
        self.demo_loss = demo_loss if hasattr(demo_loss, "state_dict") else None
        self.ckpt_dir = out_dir / CHECKPOINT_DIR
        self.resumed_from: Path | None = None

    def resume(self) -> tuple[int, int, list[dict[str, float]]]:
        """(rounds done, real steps used, history) of this run; (0, 0, []) when fresh."""
        self.resumed_from = checkpoint.prepare(
            self.ckpt_dir, fingerprint_of(self.cfg, self.fingerprint)
        )
        if self.resumed_from is None:
            if self.snapshots:  # a fresh run: snapshots of an older one must not mix in
                shutil.rmtree(self.out_dir / SNAPSHOT_DIR, ignore_errors=True)
                save_snapshot(self.policy, self.out_dir, 0)
            return 0, 0, []
        state = checkpoint.load(self.resumed_from)
        checkpoint.load_trainable_state(self.policy.model, state["policy"])
        self.learner.load_state_dict(state["learner"])
        if self.sampler is not None and state.get("sampler") is not None:
            self.sampler.load_state_dict(state["sampler"])
        if self.demo_loss is not None and state.get("demo_loss") is not None:
            self.demo_loss.load_state_dict(state["demo_loss"])
        checkpoint.set_rng_state(state["rng"])
        log.info("resumed from %s (round %d)", self.resumed_from, state["iteration"])
        return state["iteration"], state["real_steps"], list(state["history"])

    def after_round(
        self, iteration: int, real_steps: int, history: list[dict[str, float]], last: bool
    ) -> None:
        """Snapshot pi_<iteration> (before the checkpoint, so a resumed run has every one
        it needs), then checkpoint every ``save_every`` rounds and after the last."""
        if self.snapshots:
            save_snapshot(self.policy, self.out_dir, iteration)
        if iteration % self.cfg.save_every and not last:
            return
        state = {
            "policy": checkpoint.trainable_state(self.policy.model),
            "learner": self.learner.state_dict(),
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "rng": checkpoint.rng_state(),
            "demo_loss": self.demo_loss.state_dict() if self.demo_loss is not None else None,
            "iteration": iteration,
            "real_steps": real_steps,
            "history": history,
        }
        checkpoint.save(self.ckpt_dir, iteration, state, keep=self.cfg.keep_checkpoints)


def _budget_spent(cfg: RLAlgoConfig, started: float, real_steps: int) -> bool:
    """True once the wall-clock or real-step budget of ``cfg`` is spent."""
    minutes = (time.perf_counter() - started) / 60
    return (cfg.max_train_minutes is not None and minutes >= cfg.max_train_minutes) or (
        cfg.max_real_steps is not None and real_steps >= cfg.max_real_steps
    )


def train_rl(
    policy: TrainablePolicy,
    env: EnvSource,
    tasks: TaskSource,
    cfg: RLAlgoConfig,
    out_dir: Path,
    log_fn: LogFn | None = None,
    *,
    group_fn: Callable[[Task], Hashable] | None = None,
    on_rollouts: Callable[[int, RolloutBatch], None] | None = None,
    fingerprint: dict[str, Any] | None = None,
    snapshots: bool = False,
    demo_loss: DemoLoss | None = None,
) -> dict[str, Any]:
    """Train ``policy`` in place with GRPO or PPO (by ``cfg``'s type); returns a summary.

    ``env``: a vector env (``reset(tasks)``/``step(actions)``, e.g. VectorSyntheticEnv), a
    list of Env instances, or a zero-argument Env factory (a pool grows to the batch).
    ``tasks``: the task pool (a seeded sample per round) or ``tasks(iteration)`` returning
    the round's distinct tasks. ``group_fn``: PPO's advantage-normalisation groups.
    ``on_rollouts(iteration, batch)``: called with each round's episodes (buffer append,
    curriculum statistics). ``fingerprint``: extra identity of the run (e.g. start model).
    ``snapshots``: keep every round's weights under ``out_dir/snapshots`` (``snapshot_file``).
    ``demo_loss``: the behaviour-cloning term weighted by ``cfg.sft_coef`` (required then).
    """
    out_dir = Path(out_dir)
    # the reference is copied before resuming
    learner = make_learner(policy, cfg, group_fn, demo_loss)
    venv, owned = as_vector_env(env)
    sampler = tasks if isinstance(tasks, TaskSampler) else None
    ckpt = _Checkpointing(out_dir, cfg, fingerprint, policy, learner, sampler, snapshots, demo_loss)
    iteration, real_steps, history = ckpt.resume()
    # the wall-clock budget counts the time before a resume too (a kill did not reset it)
    started = time.perf_counter() - (history[-1].get("train_seconds", 0.0) if history else 0.0)
    # a spent real-step budget (0 on a fresh run too) or, resumed, a spent wall clock
    stopped_by_budget = (cfg.max_real_steps is not None and real_steps >= cfg.max_real_steps) or (
        bool(history) and _budget_spent(cfg, started, real_steps)
    )
    try:
        while iteration < cfg.iterations and not stopped_by_budget:
            seed_everything(seed_int(cfg.seed, "round", iteration))
            # 1. the round's tasks: a seeded sample, a sampler's pick or a curriculum's batch
            batch_tasks, groups = task_batch(tasks, iteration, cfg)
            # 2. rollouts: every episode of the round stepped together in the (vector) env
            policy.model.eval()
            batch = collect_rollouts(
                policy,
                venv,
                batch_tasks,
                groups=groups,
                temperature=cfg.temperature,
                max_new_tokens=cfg.max_new_tokens,
                max_turns=cfg.max_turns,
            )
            # 3. the caller's bookkeeping (DreamGym: save, append to the buffer), the sampler
            if on_rollouts is not None:
                on_rollouts(iteration, batch)
            if sampler is not None:
                # an episode the env broke (or the S2R cap cut) says nothing of the task
                sampler.update(
                    [(e.task.task_id, e.success) for e in batch.episodes if e.env_error is None]
                )
            # 4. the policy update: GRPO/PPO epochs over the round's turns
            t0 = time.perf_counter()
            stats = learner.update(batch, iteration)
            stats["policy_kl"] = (
                update_kl(policy, batch, cfg.temperature) if stats.get("optimizer_steps") else 0.0
            )
            real_steps += batch.real_steps
            iteration += 1
            # 5. log the round, then checkpoint it
            metrics = {
                **batch.metrics(),
                **stats,
                "iteration": float(iteration),
                "real_steps": float(real_steps),
                "update_seconds": time.perf_counter() - t0,
                "train_seconds": time.perf_counter() - started,
            }
            history.append(metrics)
            log.info(
                "round %d/%d: success %.3f, reward std %.3f, %d updates, kl %.4f, %d real steps",
                iteration,
                cfg.iterations,
                metrics["success_rate"],
                metrics["reward_std"],
                int(stats.get("optimizer_steps", 0)),
                float(stats.get("kl", stats["policy_kl"])),
                real_steps,
            )
            if log_fn is not None:
                log_fn(metrics, iteration)
            stopped_by_budget = _budget_spent(cfg, started, real_steps)
            ckpt.after_round(
                iteration, real_steps, history, iteration == cfg.iterations or stopped_by_budget
            )
            if stopped_by_budget:
                log.info("budget spent after round %d (%d real steps)", iteration, real_steps)
    finally:
        if owned:
            venv.close()
    policy.save(out_dir / POLICY_DIR)
    with (out_dir / HISTORY_FILE).open("w", encoding="utf-8") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")
    return summarize(history, cfg, iteration, real_steps, ckpt.resumed_from, stopped_by_budget)


def snapshot_file(out_dir: Path, iteration: int) -> Path:
    """Where ``train_rl(snapshots=True)`` keeps pi_<iteration>'s trainable weights."""
    return Path(out_dir) / SNAPSHOT_DIR / f"iter-{iteration}.pt"


def save_snapshot(policy: TrainablePolicy, out_dir: Path, iteration: int) -> Path:
    """Save the policy's trainable weights as pi_<iteration> (atomically)."""
    import torch

    path = snapshot_file(out_dir, iteration)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(checkpoint.trainable_state(policy.model), tmp)
    tmp.replace(path)
    return path


def load_snapshot(policy: TrainablePolicy, path: Path) -> None:
    """Load the weights ``save_snapshot`` wrote into a policy of the same architecture."""
    import torch

    checkpoint.load_trainable_state(
        policy.model, torch.load(path, map_location="cpu", weights_only=True)
    )


def summarize(
    history: Sequence[dict[str, float]],
    cfg: RLAlgoConfig,
    iterations: int,
    real_steps: int,
    resumed_from: Path | None,
    stopped_by_budget: bool,
) -> dict[str, Any]:
    """The run's summary: rounds, real steps, first/last success rates, costs."""
    out: dict[str, Any] = {
        "algorithm": type(cfg).__name__.removesuffix("Config").lower(),
        "iterations": iterations,
        "real_steps": real_steps,
        "episodes": int(sum(h.get("episodes", 0) for h in history)),
        "optimizer_updates": int(sum(h.get("optimizer_steps", 0) for h in history)),
        "resumed": int(resumed_from is not None),
        "stopped_by_budget": int(stopped_by_budget),
        "rollout_seconds": round(sum(h.get("rollout_seconds", 0) for h in history), 2),
        "update_seconds": round(sum(h.get("update_seconds", 0) for h in history), 2),
    }
    if history:
        k = min(3, len(history))  # a few rounds smooth the noise of one batch
        out["success_rate_first"] = sum(h["success_rate"] for h in history[:k]) / k
        out["success_rate_last"] = sum(h["success_rate"] for h in history[-k:]) / k
        out["malformed_rate_last"] = history[-1]["malformed_rate"]
    return out
