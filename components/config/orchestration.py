"""The ``orchestration`` section: how the Prefect flows run independent pipelines.

Read by the flows only (flows/envs.py), never by a DVC stage: switching the task runner
changes where work runs, not what any stage computes, so no stage lists this section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.config.base import _Section
from components.config.data import EnvName

TASK_RUNNERS = ("sequential", "dask")


class OrchestrationConfig(_Section):
    """Per-env pipelines in their own workspaces, one after the other or on Dask."""

    task_runner: Literal["sequential", "dask"] = Field(
        "sequential",
        description="sequential: one env pipeline at a time in the flow's process; "
        "dask: every env pipeline a Prefect task on a Dask cluster (prefect-dask)",
    )
    envs: tuple[EnvName, ...] = Field(
        ("textworld",), min_length=1, description="the envs the per-env flow runs, one each"
    )
    workspaces: str = Field(
        ".workspaces",
        description="folder of the per-env workspaces (git worktrees of HEAD), relative "
        "to the project root",
    )
    dask_address: str | None = Field(
        None,
        description="dask: an existing scheduler (tcp://host:8786); "
        "None: a LocalCluster on this machine",
    )
    dask_workers: int = Field(
        2, ge=1, description="dask LocalCluster: worker processes (one env pipeline each)"
    )
