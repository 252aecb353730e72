"""The per-server adapters of the AgentGym protocol (the table in ``agentgym_http.py``).

``AgentGymHttpEnv`` is one remote env as a 5-tuple Env with replay; its subclasses say how
the WebShop, ALFWorld and WebArena servers' requests and answers look.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from components.envs.agentgym_transport import RetryingHttp
from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON, EnvError
from components.envs.episodic import EpisodicEnv, Step
from components.schema import Task

MAX_STATE_CHARS = 3000  # servers may send whole pages; the abstract state stays short
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
        self.http = RetryingHttp(base_url, timeout_s, max_retries, backoff_s)
        self.remote_id: int | None = None
        self._admissible: list[str] | None = None

    # -- the protocol, per server ----------------------------------------------------------

    def _create(self) -> int:
        raise NotImplementedError

    def _reset_remote(self, index: int) -> str:
        """Reset the remote env to item ``index``; returns the first observation."""
        raise NotImplementedError

    def _step_remote(self, action: str) -> tuple[str, float, bool, bool]:
        """(observation, server reward, done, cut by the server's own limit) of one action."""
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
        """Reset the remote env to item ``task.seed`` (a remote env the server no longer
        knows, e.g. after a restart, is created anew once)."""
        del seed
        self._task = task
        self._history = []
        self._done = True  # until the server has reset: no step on the last episode's world
        stale = self.remote_id is not None  # made for an earlier episode: may be gone
        try:
            observation = self._reset_remote(int(task.seed))
        except EnvError:
            if not stale:
                raise
            self._drop_remote()
            observation = self._reset_remote(int(task.seed))
        self._done = False
        self._admissible = self._admissible_remote()
        return compact(observation), self._info("", valid=True, won=False, lost=False, reward=0.0)

    def _advance(self, action: str, limit: int | None) -> Step:
        self._require_running()
        command = action.strip()
        valid = self._is_valid(command)
        try:
            observation, server_reward, done, cut = self._step_remote(command)
        except EnvError:
            self._done = True  # the remote state is unknown now: reset before stepping again
            raise
        self._history.append(command)
        won = bool(done) and server_reward >= 1.0
        terminated = bool(done)
        # the server's own time or step cut ends the episode undecided, not lost
        truncated = not terminated and (cut or (limit is not None and len(self._history) >= limit))
        self._done = terminated or truncated
        self._admissible = [] if self._done else self._admissible_remote()
        info = self._info(
            compact(observation, 300), valid, won, terminated and not won, server_reward
        )
        return compact(observation), int(won), terminated, truncated, info

    def close(self) -> None:
        """Close the remote env (best effort) and the connection pool; a later ``reset``
        creates another (collection and evaluation reuse an env after a failure)."""
        self._drop_remote()
        self._task = None
        self.http.close()

    def _drop_remote(self) -> None:
        """Close the remote env (best effort): the next request creates another."""
        if self.remote_id is not None:
            with contextlib.suppress(EnvError):
                self.http.request(
                    "POST", "/close", json={self.id_key: self.remote_id}, idempotent=True
                )
        self.remote_id = None

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

    def _step_remote(self, action: str) -> tuple[str, float, bool, bool]:
        body = self.http.request(
            "POST", "/step", json={**self._ids(), "action": action}, idempotent=False
        )
        return str(body["state"]), float(body.get("reward") or 0.0), bool(body.get("done")), False

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

    def _step_remote(self, action: str) -> tuple[str, float, bool, bool]:
        body = self.http.request(
            "POST", "/step", json={**self._ids(), "action": action}, idempotent=False
        )
        self._available = [str(a) for a in body.get("available_actions", [])]
        return (
            str(body["observation"]),
            float(body.get("reward") or 0.0),
            bool(body.get("done")),
            False,
        )

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

    def _step_remote(self, action: str) -> tuple[str, float, bool, bool]:
        text = self.ACTION_TEMPLATE.format(action=action)
        body = self.http.request(
            "POST", "/step", json={**self._ids(), "action": text}, idempotent=False
        )
        terminated, cut = bool(body.get("terminated")), bool(body.get("truncated"))
        return str(body["observation"]), float(body.get("reward") or 0.0), terminated, cut

    def _is_valid(self, action: str) -> bool:
        return _WEBARENA_ACTION.match(action) is not None

    def instruction(self) -> str:
        """The ``OBJECTIVE:`` line of the first observation (WebArena's intent)."""
        m = _WEBARENA_GOAL.search(self._first_observation)
        return compact(m.group(1) if m else self._first_observation, 500)
