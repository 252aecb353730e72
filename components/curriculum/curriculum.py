"""One curriculum step per RL iteration: variance -> seeds -> variants -> filter -> mix.

Given the rollouts of the last iteration (``Rollout(task_id, reward)``), the curriculum
computes the reward variance of each group (GRPO: a task's n rollouts; PPO: a k-means
cluster of task embeddings), takes the highest-variance tasks as seeds, asks the
experience model's task-generation head for variants, keeps the well-formed new ones and
builds the next task batch with at most floor(lambda * batch_size) generated tasks.
Switches: ``task_generation=False`` (ablation "w/o task generation") or no ``generate_fn``
gives batches of real tasks only. Per-iteration metrics: variance histogram, share of
generated tasks, success on real / seed / generated tasks, generation and filter counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from components.config import CurriculumConfig
from components.curriculum.clusters import assign_clusters
from components.curriculum.sampling import VarianceTaskSampler
from components.curriculum.selection import (
    filter_generated,
    frontier_order,
    mix_batch,
    select_seeds,
)
from components.curriculum.variance import GroupStats, Rollout, group_stats, variance_histogram
from components.experience.task_generation import Messages, generate_variants
from components.schema import Task, seed_int

if TYPE_CHECKING:
    from components.buffer.embedders import Embedder

GroupBy = Literal["task", "cluster"]
# (seed tasks, variants per seed, iteration) -> new Task records (generated=True)
VariantFn = Callable[[Sequence[Task], int, int], list[Task]]
# (variant prompts, iteration) -> answers: the round lets a sampling backend draw other
# variants of a seed task picked again in a later round (one seed would repeat them)
RoundGenerateFn = Callable[[list[Messages], int], list[str]]


@dataclass(frozen=True)
class TaskBatch:
    """The tasks of one iteration and what the curriculum did to choose them."""

    iteration: int
    tasks: list[Task]
    seeds: list[str] = field(default_factory=list)
    new_generated: list[Task] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    variance_histogram: dict[str, int] = field(default_factory=dict)


def variant_seed(curriculum_seed: int, run_seed: int, iteration: int) -> int:
    """The sampling seed of one run's task-variant generation in round ``iteration``."""
    return seed_int("variants", curriculum_seed, run_seed, iteration)


def success_rate(rollouts: Sequence[Rollout], task_ids: set[str]) -> float | None:
    """Mean success (reward >= 1) over the rollouts of ``task_ids`` (None if there are none)."""
    hits = [r.reward >= 1 for r in rollouts if r.task_id in task_ids]
    return sum(hits) / len(hits) if hits else None


class Curriculum:
    """Chooses each iteration's task batch (state: the generated-task pool and past seeds)."""

    def __init__(
        self,
        real_tasks: Sequence[Task],
        cfg: CurriculumConfig,
        *,
        generate_fn: RoundGenerateFn | None = None,
        task_generation: bool = True,
        group_by: GroupBy = "task",
        embedder: Embedder | None = None,
        variant_fn: VariantFn | None = None,
        real_sampler: VarianceTaskSampler | None = None,
    ) -> None:
        if not real_tasks:
            raise ValueError("the curriculum needs real tasks")
        if group_by == "cluster" and embedder is None:
            raise ValueError("group_by='cluster' (PPO) needs an embedder")
        self.real = list(real_tasks)
        self.cfg = cfg
        self.generate_fn = generate_fn
        self.variant_fn = variant_fn
        self.real_sampler = real_sampler
        self.task_generation = task_generation and (
            generate_fn is not None or variant_fn is not None
        )
        self.group_by = group_by
        self.embedder = embedder
        self.generated: list[Task] = []  # in the order they fill the generated share
        self.retired: list[Task] = []  # frontier order: tied last group, never picked again
        self.seed_ids: set[str] = set()
        self.last_variance: dict[str, float] = {}  # generated task id -> last group's variance

    @property
    def tasks_by_id(self) -> dict[str, Task]:
        """Every task the curriculum knows (real and generated)."""
        return {t.task_id: t for t in [*self.real, *self.generated, *self.retired]}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue as if never stopped (JSON-serialisable)."""
        return {
            "generated": [t.model_dump(mode="json") for t in self.generated],
            "retired": [t.model_dump(mode="json") for t in self.retired],
            "last_variance": dict(self.last_variance),
            "seed_ids": sorted(self.seed_ids),
            "sampler": self.real_sampler.state_dict() if self.real_sampler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (older states have no retired tasks)."""
        self.generated = [Task(**t) for t in state["generated"]]
        self.retired = [Task(**t) for t in state.get("retired", [])]
        self.last_variance = dict(state.get("last_variance", {}))
        self.seed_ids = set(state["seed_ids"])
        if self.real_sampler is not None and state.get("sampler"):
            self.real_sampler.load_state_dict(state["sampler"])

    def first_batch(self) -> TaskBatch:
        """Iteration 0: real tasks only (no rollouts yet to measure variance)."""
        tasks = mix_batch(
            self.real, [], self.cfg.batch_size, 0.0, self._mix_seed(0), self._picker(0)
        )
        return TaskBatch(iteration=0, tasks=tasks, metrics={"share_generated": 0.0})

    def _mix_seed(self, iteration: int) -> int:
        # hashed, not seed + iteration: training seed s's round i would replay seed s+1's
        # round i-1 (the curriculum seed is curriculum.seed + training seed)
        return seed_int("mix", self.cfg.seed, iteration)

    def _picker(self, iteration: int) -> Callable[[int], list[Task]] | None:
        if self.real_sampler is None:
            return None
        sampler = self.real_sampler
        return lambda n: sampler.sample(iteration, n)

    def task_stats(self, rollouts: Sequence[Rollout]) -> dict[str, GroupStats]:
        """Per task: its own stats (GRPO) or its cluster's stats (PPO)."""
        per_task = group_stats(rollouts)
        if self.group_by == "task":
            return per_task
        known = self.tasks_by_id
        tasks = [known[t] for t in sorted(per_task) if t in known]
        assert self.embedder is not None
        clusters = assign_clusters(tasks, self.embedder, self.cfg.n_clusters, self.cfg.seed)
        per_cluster = group_stats([r for r in rollouts if r.task_id in clusters], group_of=clusters)
        return {tid: per_cluster[c] for tid, c in clusters.items()}

    def next_batch(self, rollouts: Sequence[Rollout], iteration: int) -> TaskBatch:
        """The batch of ``iteration`` from the previous iteration's rollouts."""
        if self.real_sampler is not None:
            self.real_sampler.update([(r.task_id, r.reward) for r in rollouts])
        stats = self.task_stats(rollouts)
        counts: Counter[str] = Counter()
        seeds: list[str] = []
        kept: list[Task] = []
        if self.task_generation and self.cfg.variants_per_seed > 0:
            seeds = select_seeds(stats, self.cfg.seeds_per_iteration, self.cfg.min_variance)
            known = self.tasks_by_id
            seed_tasks = [known[s] for s in seeds if s in known]
            if self.variant_fn is not None:
                candidates = self.variant_fn(seed_tasks, self.cfg.variants_per_seed, iteration)
                counts["variants_requested"] += len(seed_tasks) * self.cfg.variants_per_seed
            else:
                generate = self.generate_fn
                assert generate is not None
                candidates = generate_variants(
                    lambda prompts: generate(prompts, iteration),
                    seed_tasks,
                    self.cfg.variants_per_seed,
                    counts=counts,
                )
            kept, rejected = filter_generated(
                candidates,
                [*self.real, *self.generated, *self.retired],
                min_chars=self.cfg.min_task_chars,
                max_chars=self.cfg.max_task_chars,
            )
            counts.update({f"rejected_{k}": v for k, v in rejected.items()})
            if self.cfg.generated_order == "frontier":
                gen_ids = {t.task_id for t in self.generated}
                self.last_variance.update({t: s.variance for t, s in stats.items() if t in gen_ids})
                self.generated, retired = frontier_order(self.generated, kept, self.last_variance)
                self.retired.extend(retired)
            else:
                self.generated = kept + self.generated
            self.seed_ids.update(seeds)
        lam = self.cfg.lambda_generated if self.task_generation else 0.0
        tasks = mix_batch(
            self.real,
            self.generated,
            self.cfg.batch_size,
            lam,
            self._mix_seed(iteration),
            self._picker(iteration),
        )
        per_task = group_stats(rollouts)
        hist = variance_histogram([s.variance for s in per_task.values()], self.cfg.variance_bins)
        metrics = self._metrics(rollouts, tasks, per_task, counts, kept)
        return TaskBatch(iteration, tasks, seeds, kept, metrics, hist)

    def _metrics(
        self,
        rollouts: Sequence[Rollout],
        tasks: Sequence[Task],
        per_task: dict[str, GroupStats],
        counts: Counter[str],
        kept: Sequence[Task],
    ) -> dict[str, float]:
        gen_ids = {t.task_id for t in [*self.generated, *self.retired]}
        real_ids = {t.task_id for t in self.real}
        variances = [s.variance for s in per_task.values()]
        out: dict[str, float] = {
            "share_generated": sum(t.generated for t in tasks) / len(tasks),
            "n_generated_in_batch": float(sum(t.generated for t in tasks)),
            "n_generated_pool": float(len(self.generated)),
            "n_generated_retired": float(len(self.retired)),
            "n_generated_new": float(len(kept)),
            "mean_variance": sum(variances) / len(variances) if variances else 0.0,
            **{k: float(v) for k, v in counts.items()},
        }
        for name, ids in (
            ("success_real", real_ids),
            ("success_seed_tasks", set(self.seed_ids)),
            ("success_generated", gen_ids),
        ):
            rate = success_rate(rollouts, ids)
            if rate is not None:
                out[name] = rate
        return out
