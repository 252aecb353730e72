"""A ``Config`` built in code rather than read from params.yaml: the small task suites that
benchmarks and tests generate, collect and play."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from components.config.data import (
    CollectConfig,
    EnvConfig,
    SplitConfig,
    TaskFamilyConfig,
    TasksConfig,
)
from components.config.loading import Config

# (family, n_games, min_difficulty, max_difficulty)
FamilySpec = TaskFamilyConfig | tuple[str, int, int, int]


def small_config(
    families: Sequence[FamilySpec],
    *,
    profile: Literal["ci", "cpu", "gpu"] = "ci",
    seed: int = 0,
    env: EnvConfig | None = None,
    max_steps: int = 12,
    split: tuple[float, float] | None = None,
    task_workers: int = 2,
    episodes: dict[str, int] | None = None,
    **collect: Any,
) -> Config:
    """A Config around a few generated games; every other section keeps its defaults.

    ``env`` defaults to TextWorld with ``max_steps``; ``split`` is (train, validation)
    (``None``: the class default); ``episodes`` and ``collect`` make the collect section
    (``None``: one expert episode per game).
    """
    tasks = TasksConfig(
        families=tuple(
            f
            if isinstance(f, TaskFamilyConfig)
            else TaskFamilyConfig(name=f[0], n_games=f[1], min_difficulty=f[2], max_difficulty=f[3])  # type: ignore[arg-type]
            for f in families
        ),
        workers=task_workers,
        **({} if split is None else {"split": SplitConfig(train=split[0], validation=split[1])}),
    )
    return Config(
        profile=profile,
        seed=seed,
        env=env or EnvConfig(max_steps=max_steps),
        tasks=tasks,
        collect=CollectConfig(episodes=episodes or {"expert": 1}, **collect),
    )
