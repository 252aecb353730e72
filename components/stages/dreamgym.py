"""One DreamGym run's world: synthetic env, curriculum, co-evolving buffer, per-round state.

``DreamGymRun`` wires the pieces ``train_rl`` (components/agent/train.py) drives each
round of a DreamGym run (one training seed):

    tasks(i)         the curriculum's batch: round 0 real train tasks; later the tasks
                     with the highest reward variance seed generated variants, at most
                     floor(lambda x batch) per batch (not under ablation.no_task_generation);
                     real tasks themselves are drawn by reward variance (rl.<algo>.task_sampling)
    env              the experience model as a vector env: the grounded model
                     (components/experience/grounded_env.py, cpu) or an LLM
                     (components/experience/synthetic_env.py, gpu); never a real env
    on_rollouts(i)   the round's synthetic trajectories: saved, appended to this run's
                     fork of the replay buffer (tagged iter-<i>; the grounded model also
                     replays them in later rounds: a consistent dream), curriculum state
                     saved so a killed run resumes
    finish()         the run's synthetic trajectories, buffer and per-round metrics

A run resumed after round k's checkpoint first drops what the killed run did after it
(the work buffer back to its ``iter-<k-1>`` version, later rounds' files removed), replays
rounds < k's dreams into the grounded model only where co-evolution did, and goes on
with the episode count of round k-1 (episode ids): it ends as an uninterrupted run does.

No real env is created; the real-step count is asserted to be 0.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.io import read_json
from components.schema import Task, Trajectory, read_jsonl, write_jsonl

ROUNDS_DIR = "rounds"  # per-round curriculum state + metrics (in the checkpoint dir)
SYNTHETIC_DIR = "synthetic"  # per-round synthetic trajectories (in the checkpoint dir)
WORK_BUFFER_DIR = "buffer"  # the co-evolving buffer while training (in the checkpoint dir)
TRAIN_SPLIT = "train"


def _plain(key: str) -> str:
    return key.replace(".", "_")  # DVC plots and MLflow read plain keys best


class DreamGymRun:
    """See the module docstring; one instance per (algorithm, seed) run."""

    def __init__(
        self,
        cfg: Config,
        paths: Paths,
        *,
        algo: str,
        method: str,
        seed: int,
        tasks: Sequence[Task],
        out_dir: Path,
        tasks_per_iteration: int,
        resumed_at: int,
        exp_dir: Path | None = None,
        real: Sequence[Trajectory] = (),
    ) -> None:
        from components.artifacts import experience_model_dir
        from components.curriculum import Curriculum
        from components.curriculum.sampling import VarianceTaskSampler
        from components.curriculum.selection import subsample_tasks
        from components.experience.coevolution import coevolution_enabled, fork_seed_buffer
        from components.experience.grounded import is_grounded_dir

        self.cfg, self.paths, self.method, self.seed = cfg, paths, method, seed
        self.out_dir = out_dir
        self.rounds_dir, self.synth_dir = out_dir / ROUNDS_DIR, out_dir / SYNTHETIC_DIR
        if resumed_at == 0:  # a fresh run: nothing of an older one may leak in
            for stale in (self.rounds_dir, self.synth_dir, out_dir / WORK_BUFFER_DIR):
                shutil.rmtree(stale, ignore_errors=True)
        else:  # resumed: the rounds a killed run did after its checkpoint are redone
            for folder in (self.rounds_dir, self.synth_dir):
                for f in folder.glob("*.json*"):
                    if f.stem.isdigit() and int(f.stem) >= resumed_at:
                        f.unlink()
        self.rounds_dir.mkdir(parents=True, exist_ok=True)
        self.synth_dir.mkdir(parents=True, exist_ok=True)
        # sim-to-real's re-grounded model (components/stages/regrounding.py) or the pipeline's
        exp_dir = exp_dir or experience_model_dir(paths, "full")
        if not exp_dir.exists():
            raise FileNotFoundError(f"{exp_dir} missing: run `dreamgym train-experience-model`")
        self.coevolve = coevolution_enabled(cfg.ablation)
        self.buffer = None
        if self.coevolve:
            if not paths.buffer.exists():
                raise FileNotFoundError(f"{paths.buffer} missing: run `dreamgym build-buffer`")
            self.buffer = fork_seed_buffer(paths.buffer, out_dir / WORK_BUFFER_DIR, cfg.buffer)
            if resumed_at > 0:  # the buffer as the last checkpointed round left it
                self._rewind_buffer(resumed_at)
            if real:  # new real experience the LLM model retrieves (merged on id: idempotent)
                self.buffer.add([s for t in real for s in t.steps])
        namespace = f"{method}-seed{seed}"
        generate_fn = variant_fn = None
        if is_grounded_dir(exp_dir):
            from components.curriculum.curriculum import variant_seed
            from components.experience.grounded import GroundedModel
            from components.experience.grounded_env import GroundedVectorEnv
            from components.experience.task_generation import generated_task

            self.model: Any = GroundedModel.load(exp_dir)
            self.env: Any = GroundedVectorEnv(
                self.model,
                max_steps=cfg.synthetic.max_steps,
                env_name=cfg.env.name,
                namespace=namespace,
            )
            model = self.model

            def variant_fn(seeds: Sequence[Task], n: int, iteration: int) -> list[Task]:
                draw = variant_seed(cfg.curriculum.seed, seed, iteration)  # this run's own
                return [
                    generated_task(t, text)
                    for t in seeds
                    for text in model.variants(t, n, iteration, draw)
                ]

            if resumed_at > 0 and self.coevolve:  # remember earlier rounds' dreams, as they did
                for i in range(resumed_at):
                    model.add_synthetic(self._round_trajectories(i))
        else:
            self.model = None
            self.env, generate_fn = self._llm_env(exp_dir, namespace)
        if resumed_at > 0:  # episode ids go on from the last checkpointed round's
            env_state = read_json(self._round_file(resumed_at - 1)).get("env")
            if env_state is not None:  # (round files of older versions have none)
                self.env.load_state_dict(env_state)
        self.tasks = [t for t in tasks if self._startable(t)]
        if not self.tasks:
            from components.io import InputError

            raise InputError(
                "no train task has a recorded initial state to start synthetic episodes "
                f"(no real train trajectory in {paths.trajectories_file}?)"
            )
        # a scarce real task set (curriculum.max_real_tasks): the same subset for every seed
        self.tasks = subsample_tasks(self.tasks, cfg.curriculum.max_real_tasks)
        algo_cfg = getattr(cfg.rl, algo)
        sampler = (
            VarianceTaskSampler(self.tasks, seed=seed)
            if algo_cfg.task_sampling == "variance"
            else None
        )
        cur_cfg = cfg.curriculum.model_copy(
            update={"batch_size": tasks_per_iteration, "seed": cfg.curriculum.seed + seed}
        )
        self.curriculum = Curriculum(
            self.tasks,
            cur_cfg,
            generate_fn=generate_fn,
            variant_fn=variant_fn,
            task_generation=not cfg.ablation.no_task_generation,
            group_by="task" if algo == "grpo" else "cluster",  # PPO has no task groups
            embedder=self._embedder() if algo == "ppo" else None,
            real_sampler=sampler,
        )
        self._last: dict[int, list[Any]] = {}
        self._metrics: dict[int, dict[str, float]] = {}

    # -- construction helpers -------------------------------------------------------------

    def _llm_env(self, exp_dir: Path, namespace: str) -> tuple[Any, Any]:
        """The LLM experience model's synthetic env and its task-generation function."""
        from components.curriculum.curriculum import variant_seed
        from components.experience.sft import load_meta
        from components.experience.synthetic_env import RealStateIndex, VectorSyntheticEnv
        from components.experience.task_generation import TASK_STOP
        from components.lm.serving import OPENAI, experience_backend

        cfg = self.cfg
        if cfg.serving.backend == OPENAI:  # vLLM serves models/experience/full under its name
            backend = experience_backend(cfg.serving, self.paths.root)
        else:
            from components.lm.generate import Generator
            from components.lm.models import load_pretrained_dir

            backend = Generator(*load_pretrained_dir(exp_dir))
        trajectories = read_jsonl(self.paths.trajectories_file, Trajectory)
        index = RealStateIndex.from_trajectories(t for t in trajectories if t.split == TRAIN_SPLIT)
        self._index = index
        env = VectorSyntheticEnv.from_config(
            cfg, backend, index, buffer=self.buffer, meta=load_meta(exp_dir), namespace=namespace
        )
        cur = cfg.curriculum

        def generate_variants(prompts: list[list[dict[str, str]]], iteration: int) -> list[str]:
            return backend.generate(
                prompts,
                max_new_tokens=cur.task_max_new_tokens,
                temperature=cur.task_temperature,
                stop=(TASK_STOP,),
                batch_size=cfg.synthetic.gen_batch_size,
                seed=variant_seed(cur.seed, self.seed, iteration),
            )

        return env, generate_variants

    def _startable(self, task: Task) -> bool:
        if self.model is not None:
            return self.model.initial_state(task.task_id) is not None
        return self._index.initial_state(task.task_id) is not None

    def _embedder(self) -> Any:
        from components.buffer.embedders import make_embedder

        return self.buffer.embedder if self.buffer is not None else make_embedder(self.cfg.buffer)

    def _rewind_buffer(self, resumed_at: int) -> None:
        """Drop what a killed run appended (or evicted) after round ``resumed_at - 1``:
        back to that round's tagged version, or, in a work buffer forked again, its
        rounds appended again from their saved trajectories (idempotent)."""
        from components.experience.coevolution import append_iteration, rewind

        if not rewind(self.buffer, resumed_at - 1):
            for i in range(resumed_at):
                append_iteration(self.buffer, self._round_trajectories(i), i, overwrite_tag=True)

    def _round_file(self, iteration: int) -> Path:
        return self.rounds_dir / f"{iteration:05d}.json"

    def _round_trajectories(self, iteration: int) -> list[Trajectory]:
        path = self.synth_dir / f"{iteration:05d}.jsonl"
        return list(read_jsonl(path, Trajectory)) if path.exists() else []

    # -- what train_rl calls ----------------------------------------------------------------

    def tasks_for(self, iteration: int) -> list[Task]:
        """The curriculum's task batch of round ``iteration`` (resumes from saved state)."""
        from components.curriculum import Rollout

        cur = self.curriculum
        if iteration == 0:
            batch = cur.first_batch()
        else:
            if iteration - 1 not in self._last:  # resumed: restore the curriculum
                saved = read_json(self._round_file(iteration - 1))
                cur.load_state_dict(saved)
                self._last[iteration - 1] = [Rollout(*r) for r in saved["rollouts"]]
            batch = cur.next_batch(self._last.pop(iteration - 1), iteration)
        if any(t.split != TRAIN_SPLIT for t in batch.tasks):
            raise AssertionError("a non-train task reached the DreamGym batch")
        self._metrics[iteration] = {f"curriculum_{k}": v for k, v in batch.metrics.items()}
        return batch.tasks

    def on_rollouts(self, iteration: int, batch: Any) -> dict[str, float]:
        """Save the round's synthetic experience, co-evolve the buffer; the round's metrics."""
        from components.curriculum import Rollout
        from components.experience.coevolution import append_iteration

        if batch.real_steps:
            raise AssertionError(f"DreamGym round {iteration} took {batch.real_steps} real steps")
        trajs = self.env.trajectories(
            policy=self.method,
            iteration=iteration,
            checkpoint=f"seed-{self.seed}/round-{iteration}",
        )
        write_jsonl(self.synth_dir / f"{iteration:05d}.jsonl", trajs)
        metrics = dict(self._metrics.pop(iteration, {}))
        metrics.update({f"synthetic_{k}": v for k, v in self.env.metrics(reset=True).items()})
        if self.coevolve:
            if self.buffer is not None:
                added = append_iteration(self.buffer, trajs, iteration, overwrite_tag=True)
                metrics.update({f"buffer_{k}": v for k, v in added.metrics().items()})
            if self.model is not None:
                metrics["synthetic_remembered"] = self.model.add_synthetic(trajs)
        rollouts = [Rollout(e.task.task_id, e.reward) for e in batch.episodes]
        self._last[iteration] = rollouts
        cur = self.curriculum
        state = {
            "rollouts": [list(r) for r in rollouts],
            "env": self.env.state_dict(),
            **cur.state_dict(),
            "metrics": {_plain(k): v for k, v in metrics.items()},
        }
        self._round_file(iteration).write_text(json.dumps(state), encoding="utf-8")
        return metrics

    def finish(
        self, rounds: int
    ) -> tuple[list[Trajectory], list[dict[str, float]], dict[str, Any]]:
        """(every round's synthetic trajectories, per-round metrics, run summary)."""
        extras = [read_json(self._round_file(i))["metrics"] for i in range(rounds)]
        trajs = [t for i in range(rounds) for t in self._round_trajectories(i)]
        steps = sum(len(t.steps) for t in trajs)
        out: dict[str, Any] = {
            "synthetic_steps": steps,
            "synthetic_trajectories": len(trajs),
            "synthetic_success": sum(t.success for t in trajs) / max(1, len(trajs)),
            "generated_tasks": len(self.curriculum.generated) + len(self.curriculum.retired),
            "coevolution": int(self.coevolve),
            "task_generation": int(self.curriculum.task_generation),
        }
        for key in ("evidence_replay", "evidence_map", "evidence_edit", "evidence_unknown_room"):
            total = sum(x.get(f"synthetic_{key}", 0.0) for x in extras)
            out[f"synthetic_{key}_share"] = round(total / max(1, steps), 4)
        fallbacks = sum(x.get("synthetic_admissible_fallbacks", 0.0) for x in extras)
        out["synthetic_admissible_fallback_share"] = round(fallbacks / max(1, steps), 4)
        if self.buffer is not None:
            stats = self.buffer.stats()
            out["buffer_rows"] = int(stats["rows"])
            out["buffer_rows_synthetic"] = int(stats["rows_synthetic"])
        return trajs, extras, out

    def publish_buffer(self, dst: Path) -> None:
        """Copy the co-evolved buffer to its DVC output (an empty directory without one)."""
        from components.buffer import fork_buffer

        shutil.rmtree(dst, ignore_errors=True)
        if self.buffer is not None:
            fork_buffer(self.out_dir / WORK_BUFFER_DIR, dst, overwrite=True)
        else:
            dst.mkdir(parents=True)
