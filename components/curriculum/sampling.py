"""Task sampling by reward variance: spend rollouts where the outcome is still uncertain.

A group of rollouts whose rewards are all equal carries no GRPO signal (its advantages
are zero), and with a policy that already solves most training tasks most groups are
like that. This sampler keeps a decayed count of each task's recent
successes and draws tasks with probability proportional to ``p (1 - p) + floor``, the
reward variance of a Bernoulli outcome under a Beta(1, 1) prior (an untried task counts
as p = 0.5): the curriculum's value ``V_tau`` (the paper's task selection) applied to the task pool
itself. ``floor`` keeps every task in play. Its state is a plain dict, so an RL run
checkpoints and resumes it exactly.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from components.schema import Task


class VarianceTaskSampler:
    """Draws distinct tasks weighted by the variance of their recent rewards."""

    def __init__(
        self, tasks: Sequence[Task], *, seed: int = 0, floor: float = 0.02, decay: float = 0.5
    ) -> None:
        if not tasks:
            raise ValueError("no tasks to sample from")
        self.tasks = list(tasks)
        self.seed, self.floor, self.decay = seed, floor, decay
        self.stats: dict[str, list[float]] = {t.task_id: [0.0, 0.0] for t in self.tasks}

    def weight(self, task_id: str) -> float:
        """p (1 - p) + floor with p the posterior mean success of the task."""
        wins, n = self.stats[task_id]
        p = (wins + 1.0) / (n + 2.0)
        return p * (1.0 - p) + self.floor

    def sample(self, iteration: int, k: int) -> list[Task]:
        """``k`` distinct tasks (all of them when the pool is smaller), seeded per round."""
        rng = random.Random(f"{self.seed}:{iteration}")
        pool = list(self.tasks)
        weights = [self.weight(t.task_id) for t in pool]
        chosen: list[Task] = []
        for _ in range(min(k, len(pool))):
            i = rng.choices(range(len(pool)), weights=weights)[0]
            chosen.append(pool.pop(i))
            weights.pop(i)
        return chosen

    def update(self, outcomes: Iterable[tuple[str, bool]]) -> None:
        """Fold a round's (task_id, won) outcomes in (older rounds decay by ``decay``).

        The outcome is the env's won flag, not ``reward > 0``: under ``env.reward: score``
        a partial score gain is not a success."""
        seen: dict[str, list[float]] = {}
        for task_id, won in outcomes:
            seen.setdefault(task_id, []).append(float(bool(won)))
        for task_id, rewards in seen.items():
            if task_id not in self.stats:  # a task outside the pool (e.g. a generated one)
                continue
            st = self.stats[task_id]
            st[0] = st[0] * self.decay + sum(rewards)
            st[1] = st[1] * self.decay + len(rewards)

    def state_dict(self) -> dict[str, Any]:
        """The per-task counts (for checkpoints)."""
        return {"stats": {k: list(v) for k, v in self.stats.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counts saved by ``state_dict``."""
        for k, v in state["stats"].items():
            if k in self.stats:
                self.stats[k] = list(v)
