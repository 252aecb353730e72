"""WebArena through BrowserGym (``browsergym-webarena``), the alternative to the HTTP server."""

from __future__ import annotations

import contextlib
from typing import Any

from components.envs.agentgym_adapters import MOVES, compact
from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON, EnvError, StepResult
from components.schema import Task


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
