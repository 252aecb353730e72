"""The small TextWorld task suite shared by the integration tests."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.config import Config
from components.config.small import small_config
from components.schema import Task


def suite_config(seed: int = 7) -> Config:
    """5 small games: 3 quests (difficulty 1-3), 1 cooking, 1 treasure hunt."""
    return small_config(
        [("quest", 3, 1, 3), ("cooking", 1, 1, 1), ("treasure", 1, 1, 1)],
        seed=seed,
        split=(0.4, 0.3),
        episodes={"expert": 1, "noisy": 2, "random": 2},
        epsilon=0.3,
        p_invalid=0.2,
        splits=("train", "validation"),
        workers=2,
    )


@dataclass(frozen=True)
class Suite:
    """A generated task suite: its config, project root and tasks."""

    cfg: Config
    root: Path
    tasks: list[Task]

    @property
    def tasks_dir(self) -> Path:
        return self.root / "data" / "tasks"

    def task(self, family: str, split: str | None = None) -> Task:
        """The first task of a family (and split)."""
        return next(
            t for t in self.tasks if t.family == family and (split is None or t.split == split)
        )


def games_pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's shared folder of generated games (one for all xdist workers)."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's basetemp (popen-gwN) sits in the run's own folder
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tw-games-pool"


def generate_shared(cfg: Config, root: Path, pool: Path) -> list[Task]:
    """``generate_task_suite`` under ``root``, reusing games another fixture already made.

    A game depends only on its spec, and the generator reuses a game file only when its
    meta matches the spec, so copying a planned game out of the pool is safe. The pool is
    locked while a fixture generates: a game is made once per run, by whichever worker
    plans it first (~2.5 s of CPU a game).
    """
    import fcntl

    from components.envs.textworld_tasks import GAMES_DIR, generate_task_suite, plan_task_suite

    out_dir = root / "data" / "tasks"
    games = out_dir / GAMES_DIR
    games.mkdir(parents=True, exist_ok=True)
    pool.mkdir(parents=True, exist_ok=True)
    planned = {s.task_id for s in plan_task_suite(cfg)}

    def ours(path: Path) -> bool:
        return path.is_file() and path.name.split(".", 1)[0] in planned

    with open(pool / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for src in filter(ours, pool.iterdir()):
            shutil.copy2(src, games / src.name)
        tasks = generate_task_suite(cfg, out_dir, progress=False, root=root)
        for src in filter(ours, games.iterdir()):
            if not (pool / src.name).exists():
                shutil.copy2(src, pool / src.name)
    return tasks
