"""Real environments behind one interface (see base.py), created by name from EnvConfig."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.config import Config, EnvConfig
from components.config.data import AGENTGYM_ENVS
from components.envs.base import Env
from components.schema import Task


def _textworld(env_cfg: EnvConfig, root: Path | None, expert: bool, shared: Any = None) -> Env:
    from components.envs.textworld_env import TextWorldEnv

    return TextWorldEnv(
        max_steps=env_cfg.max_steps,
        root=root,
        expert=expert,
        engines=shared,
        reward=env_cfg.reward,
    )


def _scienceworld(env_cfg: EnvConfig, root: Path | None, expert: bool, shared: Any = None) -> Env:
    from components.envs.scienceworld_env import ScienceWorldEnv

    sw = env_cfg.scienceworld
    return ScienceWorldEnv(
        max_steps=env_cfg.max_steps,
        simplifications=sw.simplifications,
        max_admissible=sw.max_admissible,
        reward=env_cfg.reward,
    )


def _miniwob(env_cfg: EnvConfig, root: Path | None, expert: bool, shared: Any = None) -> Env:
    from components.envs.miniwob_env import MiniWoBEnv

    return MiniWoBEnv.from_config(env_cfg)


def _agentgym(env_cfg: EnvConfig, root: Path | None, expert: bool, shared: Any = None) -> Env:
    from components.envs.agentgym_http import make_agentgym_env

    return make_agentgym_env(env_cfg)


# name -> factory(env_cfg, root, expert, shared); root resolves the relative game files of
# tasks; expert: the env must answer expert_action() (only collection needs it; TextWorld is
# ~2x faster without it, the other envs ignore the flag); shared: what the envs of one
# env_factory share (TextWorld: its pool of loaded games), None for a lone env
ENV_FACTORIES: dict[str, Callable[[EnvConfig, Path | None, bool, Any], Env]] = {
    "textworld": _textworld,
    "scienceworld": _scienceworld,
    "miniwob": _miniwob,
    "webshop": _agentgym,
    "alfworld": _agentgym,
    "webarena": _agentgym,
}


def make_env(env_cfg: EnvConfig, root: Path | None = None, *, expert: bool = False) -> Env:
    """A fresh env for ``env_cfg.name``; ``root`` is the project root (default: cwd).

    ``expert=True``: the env can answer ``expert_action()`` (collection's policies).
    """
    return _factory_of(env_cfg)(env_cfg, root, expert, None)


def env_factory(
    env_cfg: EnvConfig, root: Path | None = None, *, expert: bool = False
) -> Callable[[], Env]:
    """``make_env`` as a factory whose envs share what they can (TextWorld: loaded games,
    so restarting a game another env played is a reset, not a reload)."""
    factory = _factory_of(env_cfg)
    shared: Any = None
    if env_cfg.name == "textworld":
        from components.envs.textworld_engines import EnginePool

        shared = EnginePool()
    return lambda: factory(env_cfg, root, expert, shared)


def _factory_of(env_cfg: EnvConfig) -> Callable[[EnvConfig, Path | None, bool, Any], Env]:
    try:
        return ENV_FACTORIES[env_cfg.name]
    except KeyError:
        raise ValueError(f"unknown env {env_cfg.name!r}; known: {sorted(ENV_FACTORIES)}") from None


def generate_task_suite(cfg: Config, out_dir: Path, root: Path) -> list[Task]:
    """The task suite of ``cfg.env.name`` written to ``out_dir/tasks.jsonl`` (the
    generate-tasks stage); ``root`` is the project root that game files are relative to."""
    name = cfg.env.name
    if name == "scienceworld":
        from components.envs.scienceworld_tasks import generate_task_suite as scienceworld

        return scienceworld(cfg, out_dir)
    if name == "miniwob":
        from components.envs.miniwob_tasks import generate_task_suite as miniwob

        return miniwob(cfg, out_dir)
    if name in AGENTGYM_ENVS:
        from components.envs.agentgym_http import generate_task_suite as agentgym

        return agentgym(cfg, out_dir)
    from components.envs.textworld_tasks import generate_task_suite as textworld

    return textworld(cfg, out_dir, root=root)
