"""The small TextWorld task suite shared by the integration tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
