"""The paper's envs (WebShop, ALFWorld, WebArena) through AgentGym-style HTTP env servers.

AgentGym (github.com/WooooDyy/AgentGym) runs each environment as a small HTTP server;
its clients speak this protocol (one remote env per ``create``, addressed by an id):

=========  ==========================================  ===================================
env        requests                                    answers
=========  ==========================================  ===================================
webshop    POST /create                                int env_idx
           POST /reset {env_idx, session_id}           [observation, null]
           POST /step {env_idx, action}                {state, reward, done, info}
           GET /observation?env_idx=                   str
           GET /available_actions?env_idx=             {has_search_bar, clickables}
           GET /instruction_text?env_idx=              str
           POST /close {env_idx}                       {closed}
alfworld   POST /create                                {id}
           POST /reset {id, game, world_type: Text}    {id, observation, available_actions,
                                                        task_type}
           POST /step {id, action}                     {observation, reward, available_actions,
                                                        done}
           GET /observation?id=, /available_actions?id=
           POST /close {id}
webarena   POST /create                                {env_idx}
           POST /reset {env_idx, seed: 0, idx}         {observation}
           POST /step {env_idx, action: llm text}      {observation, reward, terminated,
                                                        truncated, info}
           GET /observation?env_idx=                   str
           POST /close {env_idx}
=========  ==========================================  ===================================

A failed request (``{"error": ...}`` in the body) is an application error. Task item
indices (WebShop session, ALFWorld game, WebArena config) are ``Task.seed``.

Retries are for I/O only, never for application errors, and never where a retry could
apply an action twice (the rules: ``agentgym_transport.py``).
Rewards are outcome-only: 1 on the step that ends the episode with the server's reward
>= 1 (WebShop gives partial credit below 1: not a success), else 0. ``replay`` resets the
item and re-applies the prefix (the servers are deterministic per item). WebArena can also
run through BrowserGym when that package is installed (``BrowserGymWebArenaEnv``).
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

from components.config import Config, EnvConfig
from components.config.data import AGENTGYM_ENVS  # noqa: F401  (re-exported)
from components.envs.agentgym_adapters import (
    MAX_STATE_CHARS,  # noqa: F401  (re-exported)
    MOVES,  # noqa: F401  (re-exported)
    SERVER_REWARD,  # noqa: F401  (re-exported)
    AgentGymHttpEnv,
    AlfWorldHttpEnv,
    WebArenaHttpEnv,
    WebShopHttpEnv,
    compact,  # noqa: F401  (re-exported)
)
from components.envs.agentgym_transport import MAX_BACKOFF_S  # noqa: F401  (re-exported)
from components.envs.base import TASKS_FILE, EnvError, write_task_suite  # noqa: F401  (TASKS_FILE)
from components.envs.browsergym_webarena import BrowserGymWebArenaEnv
from components.schema import Split, Task

log = logging.getLogger(__name__)


ENV_CLASSES: dict[str, type[AgentGymHttpEnv]] = {
    "webshop": WebShopHttpEnv,
    "alfworld": AlfWorldHttpEnv,
    "webarena": WebArenaHttpEnv,
}


def server_url(env_cfg: EnvConfig) -> str:
    """The env server's base URL: ``agentgym.base_url``, else ``$<agentgym.url_env>``."""
    ag = env_cfg.agentgym
    url = ag.base_url or os.environ.get(ag.url_env)
    if not url:
        raise EnvError(
            f"env {env_cfg.name!r} needs a running AgentGym env server: "
            f"export {ag.url_env}=http://host:port (or set env.agentgym.base_url)"
        )
    return url


def make_agentgym_env(env_cfg: EnvConfig) -> Any:
    """The adapter for ``env_cfg.name`` (webshop / alfworld / webarena)."""
    if env_cfg.name == "webarena" and env_cfg.agentgym.browsergym:
        return BrowserGymWebArenaEnv(max_steps=env_cfg.max_steps)
    ag = env_cfg.agentgym
    return ENV_CLASSES[env_cfg.name](
        server_url(env_cfg),
        max_steps=env_cfg.max_steps,
        timeout_s=ag.timeout_s,
        max_retries=ag.max_retries,
        backoff_s=ag.backoff_s,
    )


def generate_task_suite(cfg: Config, out_dir: Path) -> list[Task]:
    """Tasks for the item ranges of ``cfg.env.agentgym.splits``, instructions read from the
    server (one reset per item); written to ``out_dir/tasks.jsonl``."""
    env_cfg = cfg.env
    splits: dict[Split, tuple[int, int]] = dict(env_cfg.agentgym.splits)
    ranges = sorted(splits.values())
    if any(a[1] > b[0] for a, b in itertools.pairwise(ranges)):
        raise ValueError(f"agentgym.splits overlap: {splits}")
    env = make_agentgym_env(env_cfg)
    tasks: list[Task] = []
    try:
        for split in ("train", "validation", "test"):
            start, stop = splits.get(split, (0, 0))  # type: ignore[call-overload]
            for index in range(start, stop):
                probe = Task(
                    task_id=f"{env_cfg.name}-{index:05d}",
                    env=env_cfg.name,
                    family=env_cfg.name,
                    difficulty=0,
                    split=split,
                    instruction="probe",
                    seed=index,
                )
                env.reset(probe)
                goal = env.instruction() if hasattr(env, "instruction") else ""
                tasks.append(probe.model_copy(update={"instruction": goal or f"item {index}"}))
    finally:
        env.close()
    write_task_suite(out_dir, tasks)
    log.info("%s suite: %d tasks", env_cfg.name, len(tasks))
    return tasks
