"""Real environments behind one interface (see base.py), created by name from EnvConfig."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from components.config import EnvConfig
from components.envs.base import Env


def _textworld(env_cfg: EnvConfig, root: Path | None) -> Env:
    from components.envs.textworld_env import TextWorldEnv

    return TextWorldEnv(max_steps=env_cfg.max_steps, root=root)


# name -> factory(env_cfg, root); root resolves the relative game files of tasks
ENV_FACTORIES: dict[str, Callable[[EnvConfig, Path | None], Env]] = {
    "textworld": _textworld,
}


def make_env(env_cfg: EnvConfig, root: Path | None = None) -> Env:
    """A fresh env for ``env_cfg.name``; ``root`` is the project root (default: cwd)."""
    try:
        factory = ENV_FACTORIES[env_cfg.name]
    except KeyError:
        raise ValueError(f"unknown env {env_cfg.name!r}; known: {sorted(ENV_FACTORIES)}") from None
    return factory(env_cfg, root)
