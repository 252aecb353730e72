"""The small TextWorld task suite shared by the integration tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from components.config import (
    CollectConfig,
    Config,
    EnvConfig,
    SplitConfig,
    TaskFamilyConfig,
    TasksConfig,
)
from components.schema import Task


def suite_config(seed: int = 7) -> Config:
    """5 small games: 3 quests (difficulty 1-3), 1 cooking, 1 treasure hunt."""
    return Config(
        profile="ci",
        seed=seed,
        env=EnvConfig(max_steps=12),
        tasks=TasksConfig(
            families=(
                TaskFamilyConfig(name="quest", n_games=3, min_difficulty=1, max_difficulty=3),
                TaskFamilyConfig(name="cooking", n_games=1, min_difficulty=1, max_difficulty=1),
                TaskFamilyConfig(name="treasure", n_games=1, min_difficulty=1, max_difficulty=1),
            ),
            split=SplitConfig(train=0.4, validation=0.3),
            workers=2,
        ),
        collect=CollectConfig(
            episodes={"expert": 1, "noisy": 2, "random": 2},
            epsilon=0.3,
            p_invalid=0.2,
            splits=("train", "validation"),
            workers=2,
        ),
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
