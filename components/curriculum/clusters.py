"""Semantic task groups for PPO: k-means over task-instruction embeddings.

PPO has no per-task rollout groups, so the curriculum groups tasks by meaning: the
instructions are embedded with the replay buffer's embedder (``Embedder`` protocol, unit
rows) and clustered with seeded k-means++ / Lloyd in numpy (cosine geometry: unit
vectors, so squared Euclidean distance = 2 - 2 cos). Reward variance is then computed per
cluster (``variance.group_stats(rollouts, group_of=assign_clusters(...))``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from components.schema import Task

if TYPE_CHECKING:
    from components.buffer.embedders import Embedder


def kmeans(
    x: np.ndarray, k: int, seed: int = 0, max_iter: int = 100, tol: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """(labels, centroids) of seeded k-means++ then Lloyd; k is capped at the distinct rows."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros((0, x.shape[1] if x.ndim == 2 else 0))
    k = max(1, min(k, len(np.unique(x, axis=0))))
    rng = np.random.default_rng(seed)
    centroids = [x[rng.integers(n)]]
    for _ in range(1, k):  # k-means++: far points are likelier next centres
        d2 = np.min(((x[:, None, :] - np.array(centroids)[None]) ** 2).sum(-1), axis=1)
        centroids.append(x[rng.choice(n, p=d2 / d2.sum())])
    c = np.array(centroids)
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(max_iter):
        d2 = ((x[:, None, :] - c[None]) ** 2).sum(-1)
        labels = d2.argmin(axis=1)
        new = np.array(
            [x[labels == j].mean(axis=0) if np.any(labels == j) else c[j] for j in range(k)]
        )
        shift = float(((new - c) ** 2).sum())
        c = new
        if shift <= tol:
            break
    return labels, c


def assign_clusters(
    tasks: Sequence[Task], embedder: Embedder, k: int, seed: int = 0
) -> dict[str, int]:
    """task_id -> cluster index of each task's instruction embedding."""
    if not tasks:
        return {}
    vecs = embedder.embed([t.instruction for t in tasks])
    labels, _ = kmeans(vecs, k, seed=seed)
    return {t.task_id: int(label) for t, label in zip(tasks, labels, strict=True)}


def cluster_groups(assignment: dict[str, int]) -> list[list[str]]:
    """The task ids of each cluster, clusters ordered by index."""
    groups: dict[int, list[str]] = {}
    for tid, c in assignment.items():
        groups.setdefault(c, []).append(tid)
    return [sorted(groups[c]) for c in sorted(groups)]
