"""Reward variance per task (or per group) over an iteration's rollouts.

The curriculum's value of a task is V = (1/n) sum_i (r_i - mean r)^2 over its group of n
rollouts (population variance): 0 when the agent always fails or always succeeds, at
most 0.25 at 50% success, the tasks that are feasible but not yet mastered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

MAX_VARIANCE = 0.25  # binary rewards: p (1 - p) peaks at p = 0.5


class Rollout(NamedTuple):
    """One finished episode's outcome."""

    task_id: str
    reward: float


@dataclass(frozen=True)
class GroupStats:
    """Rewards of one group (a task, or a PPO cluster) summarised."""

    n: int
    mean: float
    variance: float


def reward_variance(rewards: Sequence[float]) -> float:
    """Population variance of a group's rewards (0 for an empty group)."""
    if not rewards:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return sum((r - mean) ** 2 for r in rewards) / len(rewards)


def group_stats(
    rollouts: Iterable[Rollout], group_of: Mapping[str, str | int] | None = None
) -> dict[str | int, GroupStats]:
    """Stats per task, or per group when ``group_of`` maps task_id -> group (PPO clusters)."""
    rewards: dict[str | int, list[float]] = defaultdict(list)
    for r in rollouts:
        key = r.task_id if group_of is None else group_of[r.task_id]
        rewards[key].append(float(r.reward))
    return {
        k: GroupStats(n=len(v), mean=sum(v) / len(v), variance=reward_variance(v))
        for k, v in rewards.items()
    }


def variance_histogram(variances: Iterable[float], bins: int) -> dict[str, int]:
    """Counts of variances in ``bins`` equal bins over [0, 0.25] (keys: bin lower edges)."""
    width = MAX_VARIANCE / bins
    counts = [0] * bins
    for v in variances:
        counts[min(bins - 1, max(0, int(v / width + 1e-9)))] += 1
    return {f"{i * width:.3f}": c for i, c in enumerate(counts)}
