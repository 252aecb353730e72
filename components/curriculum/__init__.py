"""Curriculum task generation: reward variance, seed selection, lambda mixing, PPO clusters."""

from components.curriculum.clusters import assign_clusters, cluster_groups, kmeans
from components.curriculum.curriculum import Curriculum, TaskBatch, success_rate
from components.curriculum.selection import (
    filter_generated,
    mix_batch,
    n_generated_slots,
    normalize_text,
    select_seeds,
    well_formed,
)
from components.curriculum.variance import (
    GroupStats,
    Rollout,
    group_stats,
    reward_variance,
    variance_histogram,
)

__all__ = [
    "Curriculum",
    "GroupStats",
    "Rollout",
    "TaskBatch",
    "assign_clusters",
    "cluster_groups",
    "filter_generated",
    "group_stats",
    "kmeans",
    "mix_batch",
    "n_generated_slots",
    "normalize_text",
    "reward_variance",
    "select_seeds",
    "success_rate",
    "variance_histogram",
    "well_formed",
]
