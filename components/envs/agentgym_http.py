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
apply an action twice: a request that never reached the server (connection refused,
connect timeout) and a 503 ("not processed, busy") are retried for every request; a read
timeout, a dropped connection or another 5xx is retried only for idempotent requests
(reset of the same item, observation, available actions, close); for ``step`` and
``create`` it fails the episode (EnvError), as the server may have applied it. 4xx and
``{"error"}`` answers fail at once.

Rewards are outcome-only: 1 on the step that ends the episode with the server's reward
>= 1 (WebShop gives partial credit below 1: not a success), else 0. ``replay`` resets the
item and re-applies the prefix (the servers are deterministic per item). WebArena can also
run through BrowserGym when that package is installed (``BrowserGymWebArenaEnv``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from components.config import Config, EnvConfig
from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON, EnvError, StepResult
from components.envs.episodic import EpisodicEnv, Step
from components.schema import Split, Task, write_jsonl

log = logging.getLogger(__name__)

AGENTGYM_ENVS = ("webshop", "alfworld", "webarena")
TASKS_FILE = "tasks.jsonl"
MAX_STATE_CHARS = 3000  # servers may send whole pages; the abstract state stays short
MAX_BACKOFF_S = 10.0
MOVES = "moves"  # extra info key
SERVER_REWARD = "server_reward"  # extra info key: the server's own (possibly partial) reward

_WS = re.compile(r"[ \t\r\f\v]+")
_WEBSHOP_ACTION = re.compile(r"^(search|click)\[(.+)\]$", re.DOTALL)
_WEBARENA_ACTION = re.compile(
    r"^(click \[\d+\]|type \[\d+\] \[.*\]( \[[01]\])?|hover \[\d+\]|press \[.+\]|"
    r"scroll \[(up|down)\]|new_tab|tab_focus \[\d+\]|close_tab|goto \[.+\]|go_back|"
    r"go_forward|stop \[.*\])$",
    re.DOTALL,
)
_ALFWORLD_GOAL = re.compile(r"Your task is to:\s*(.+)")
_WEBARENA_GOAL = re.compile(r"OBJECTIVE:\s*(.+)")


def compact(text: str, limit: int = MAX_STATE_CHARS) -> str:
    """Whitespace-collapsed text, WebShop's ``[SEP]`` as line breaks, at most ``limit`` chars."""
    lines = [_WS.sub(" ", ln).strip() for ln in str(text).replace("[SEP]", "\n").splitlines()]
    out = "\n".join(ln for ln in lines if ln)
    return out if len(out) <= limit else out[: limit - 3] + "..."


class _Http:
    """JSON over HTTP with the retry rules of the module docstring."""

    def __init__(self, base_url: str, timeout_s: float, max_retries: int, backoff_s: float):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.client = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool,
    ) -> Any:
        """The decoded JSON answer; raises EnvError once retries are spent or not allowed."""
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                response = self.client.request(method, path, json=json, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:  # never reached it
                last = f"{type(err).__name__}: {err}"
                continue
            except httpx.TransportError as err:  # read timeout, dropped connection...
                last = f"{type(err).__name__}: {err}"
                if idempotent:
                    continue
                raise EnvError(f"{method} {path}: {last} (not retried: may have applied)") from err
            if response.status_code == 503 or (response.status_code >= 500 and idempotent):
                last = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise EnvError(
                    f"{method} {path}: HTTP {response.status_code}: {response.text[:200]}"
                )
            try:
                body = response.json()
            except ValueError as err:
                raise EnvError(f"{method} {path}: not JSON: {response.text[:200]}") from err
            if isinstance(body, dict) and "error" in body:
                raise EnvError(f"{method} {path}: server error: {body['error']}")
            return body
        raise EnvError(f"{method} {path} failed after {self.max_retries + 1} tries: {last}")

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()


class AgentGymHttpEnv(EpisodicEnv):
    """One remote env on an AgentGym-style server, as a 5-tuple Env with replay.

    Subclasses say how their server's requests and answers look (``_create``,
    ``_reset_remote``, ``_step_remote``, ``_admissible_remote``, ``instruction``).
    """

    name = "agentgym"
    id_key = "env_idx"
    continue_replay = False  # a remote env may not be deterministic: always reset

    def __init__(
        self,
        base_url: str,
        max_steps: int,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        super().__init__(max_steps)
        self.http = _Http(base_url, timeout_s, max_retries, backoff_s)
        self.remote_id: int | None = None
        self._admissible: list[str] | None = None

    # -- the protocol, per server ----------------------------------------------------------

    def _create(self) -> int:
        raise NotImplementedError

    def _reset_remote(self, index: int) -> str:
        """Reset the remote env to item ``index``; returns the first observation."""
        raise NotImplementedError

    def _step_remote(self, action: str) -> tuple[str, float, bool]:
        """(observation, server reward, done) of one action."""
        raise NotImplementedError

    def _admissible_remote(self) -> list[str] | None:
        """Admissible actions now (None: the server does not enumerate them)."""
        return None

    def instruction(self) -> str:
        """The goal of the item the remote env was last reset to."""
        raise NotImplementedError

    def _is_valid(self, action: str) -> bool:
        return self._admissible is None or action in self._admissible

    # -- Env -------------------------------------------------------------------------------

    def _ids(self) -> dict[str, int]:
        if self.remote_id is None:
            self.remote_id = self._create()
        return {self.id_key: self.remote_id}

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Reset the remote env to item ``task.seed``."""
        del seed
        self._task = task
        observation = self._reset_remote(int(task.seed))
        self._history = []
        self._done = False
        self._admissible = self._admissible_remote()
        return compact(observation), self._info("", valid=True, won=False, lost=False, reward=0.0)

    def _advance(self, action: str, limit: int | None) -> Step:
        self._require_running()
        command = action.strip()
        valid = self._is_valid(command)
        observation, server_reward, done = self._step_remote(command)
        self._history.append(command)
        won = bool(done) and server_reward >= 1.0
        terminated = bool(done)
        truncated = not terminated and limit is not None and len(self._history) >= limit
        self._done = terminated or truncated
        self._admissible = [] if terminated else self._admissible_remote()
        info = self._info(
            compact(observation, 300), valid, won, terminated and not won, server_reward
        )
        return compact(observation), int(won), terminated, truncated, info

    def close(self) -> None:
        """Close the remote env (best effort) and the connection pool."""
        if self.remote_id is not None:
            with contextlib.suppress(EnvError):
                self.http.request(
                    "POST", "/close", json={self.id_key: self.remote_id}, idempotent=True
                )
        self.remote_id = None
        self._task = None
        self.http.close()

    def expert_action(self) -> str | None:
        """No expert through the HTTP protocol (collection policies act randomly)."""
        return None

    def _info(
        self, feedback: str, valid: bool, won: bool, lost: bool, reward: float
    ) -> dict[str, Any]:
        return {
            ADMISSIBLE: None if self._admissible is None else list(self._admissible),
            VALID: valid,
            WON: won,
            LOST: lost,
            FEEDBACK: feedback,
            MOVES: len(self._history),
            SERVER_REWARD: reward,
        }


class WebShopHttpEnv(AgentGymHttpEnv):
    """WebShop (``agentenv-webshop``): actions ``search[keywords]`` / ``click[value]``."""

    name = "webshop"
    id_key = "env_idx"

    def _create(self) -> int:
        return int(self.http.request("POST", "/create", idempotent=False))

    def _reset_remote(self, index: int) -> str:
        self.http.request(
            "POST", "/reset", json={**self._ids(), "session_id": index}, idempotent=True
        )
        return str(self.http.request("GET", "/observation", params=self._ids(), idempotent=True))

    def _step_remote(self, action: str) -> tuple[str, float, bool]:
        body = self.http.request(
            "POST", "/step", json={**self._ids(), "action": action}, idempotent=False
        )
        return str(body["state"]), float(body.get("reward") or 0.0), bool(body.get("done"))

    def _admissible_remote(self) -> list[str] | None:
        body = self.http.request("GET", "/available_actions", params=self._ids(), idempotent=True)
        actions = [f"click[{c}]" for c in body.get("clickables", [])]
        if body.get("has_search_bar"):
            # search keywords are free text: offer the goal itself as the one listed query
            actions.append(f"search[{self.instruction()[:100]}]")
        return actions

    def instruction(self) -> str:
        """WebShop's ``Instruction: ...`` text without the prefix."""
        text = str(
            self.http.request("GET", "/instruction_text", params=self._ids(), idempotent=True)
        )
        return compact(re.sub(r"^\s*Instruction:\s*", "", text), 500)

    def _is_valid(self, action: str) -> bool:
        m = _WEBSHOP_ACTION.match(action)
        if m is None:
            return False
        if m.group(1) == "search":
            return any(a.startswith("search[") for a in self._admissible or [])
        return action in (self._admissible or [])


class AlfWorldHttpEnv(AgentGymHttpEnv):
    """ALFWorld (``agentenv-alfworld``, TextWorld engine): admissible commands from the server."""

    name = "alfworld"
    id_key = "id"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._available: list[str] = []
        self._first_observation = ""

    def _create(self) -> int:
        return int(self.http.request("POST", "/create", idempotent=False)["id"])

    def _reset_remote(self, index: int) -> str:
        body = self.http.request(
            "POST",
            "/reset",
            json={**self._ids(), "game": index, "world_type": "Text"},
            idempotent=True,
        )
        self._available = [str(a) for a in body.get("available_actions", [])]
        self._first_observation = str(body["observation"])
        return self._first_observation

    def _step_remote(self, action: str) -> tuple[str, float, bool]:
        body = self.http.request(
            "POST", "/step", json={**self._ids(), "action": action}, idempotent=False
        )
        self._available = [str(a) for a in body.get("available_actions", [])]
        return str(body["observation"]), float(body.get("reward") or 0.0), bool(body.get("done"))

    def _admissible_remote(self) -> list[str] | None:
        return sorted(self._available)

    def instruction(self) -> str:
        """The ``Your task is to: ...`` sentence of the first observation."""
        m = _ALFWORLD_GOAL.search(self._first_observation)
        return compact(m.group(1) if m else self._first_observation, 500)


class WebArenaHttpEnv(AgentGymHttpEnv):
    """WebArena (``agentenv-webarena``): id-based actions (``click [12]``, ``stop [answer]``)."""

    name = "webarena"
    id_key = "env_idx"
    # the server extracts the action between ``` after its own "force prefix"
    ACTION_TEMPLATE = "In summary, the next action I will perform is ```{action}```"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._first_observation = ""

    def _create(self) -> int:
        return int(self.http.request("POST", "/create", idempotent=False)["env_idx"])

    def _reset_remote(self, index: int) -> str:
        body = self.http.request(
            "POST", "/reset", json={**self._ids(), "seed": 0, "idx": index}, idempotent=True
        )
        self._first_observation = str(body["observation"])
        return self._first_observation

    def _step_remote(self, action: str) -> tuple[str, float, bool]:
        text = self.ACTION_TEMPLATE.format(action=action)
        body = self.http.request(
            "POST", "/step", json={**self._ids(), "action": text}, idempotent=False
        )
        done = bool(body.get("terminated")) or bool(body.get("truncated"))
        return str(body["observation"]), float(body.get("reward") or 0.0), done

    def _is_valid(self, action: str) -> bool:
        return _WEBARENA_ACTION.match(action) is not None

    def instruction(self) -> str:
        """The ``OBJECTIVE:`` line of the first observation (WebArena's intent)."""
        m = _WEBARENA_GOAL.search(self._first_observation)
        return compact(m.group(1) if m else self._first_observation, 500)


class BrowserGymWebArenaEnv:
    """WebArena through BrowserGym (``browsergym-webarena``) when installed: ``Task.seed`` is
    the WebArena task id, the state is the flattened accessibility tree, actions are
    BrowserGym's high-level action strings (``click('12')``, ``fill('5', 'text')``...).

    Untested here: browsergym is not installed on the development machine (import-guarded).
    """

    name = "webarena"

    def __init__(self, max_steps: int) -> None:
        try:
            import browsergym.webarena  # noqa: F401  (registers browsergym/webarena.<id>)
        except ImportError as err:
            raise EnvError("BrowserGym is not installed: pip install browsergym-webarena") from err
        self.max_steps = max_steps
        self._env: Any = None
        self._task: Task | None = None
        self._history: list[str] = []

    def _render(self, obs: dict[str, Any]) -> str:
        from browsergym.utils.obs import flatten_axtree_to_str

        return compact(flatten_axtree_to_str(obs["axtree_object"]))

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Open WebArena task ``task.seed`` in a fresh BrowserGym env."""
        import gymnasium as gym

        self.close()
        self._env = gym.make(f"browsergym/webarena.{int(task.seed)}")
        obs, _ = self._env.reset(seed=seed or 0)
        self._task, self._history = task, []
        info = {ADMISSIBLE: None, VALID: True, WON: False, LOST: False, FEEDBACK: "", MOVES: 0}
        return self._render(obs), info

    def step(self, action: str) -> tuple[str, int, bool, bool, dict[str, Any]]:
        """Apply one BrowserGym action string."""
        if self._env is None:
            raise RuntimeError("step() called before reset()")
        obs, reward, terminated, truncated, _ = self._env.step(action)
        self._history.append(action)
        truncated = bool(truncated) or (not terminated and len(self._history) >= self.max_steps)
        won = bool(terminated) and float(reward) >= 1.0
        error = str(obs.get("last_action_error") or "")
        info = {
            ADMISSIBLE: None,
            VALID: not error,
            WON: won,
            LOST: bool(terminated) and not won,
            FEEDBACK: error,
            MOVES: len(self._history),
        }
        return self._render(obs), int(won), bool(terminated), truncated, info

    def expert_action(self) -> str | None:
        """No expert."""
        return None

    def replay(self, task: Task, action_prefix: list[str], action: str) -> StepResult:
        """Reset the task, re-apply the prefix, apply ``action``."""
        self.reset(task)
        for a in action_prefix:
            self.step(a)
        return StepResult(*self.step(action))

    def close(self) -> None:
        """Close the browser."""
        if self._env is not None:
            with contextlib.suppress(Exception):
                self._env.close()
        self._env = None


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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (TASKS_FILE + ".tmp")
    write_jsonl(tmp, tasks)
    os.replace(tmp, out_dir / TASKS_FILE)
    log.info("%s suite: %d tasks", env_cfg.name, len(tasks))
    return tasks
