"""What the real envs share: episode bookkeeping, the step limit and replay by prefix.

Each env implements ``reset`` and ``_advance(action, limit)`` (one action; ``limit`` is the
step limit that truncates the episode, None while a replay re-applies its prefix).
``EpisodicEnv`` gives them ``step``, the running-episode check, ``history``,
``admissible_actions`` and ``replay``: restore the state reached by an action prefix,
then apply one action, exactly as live stepping would (the fidelity checks rely on it).
"""

from __future__ import annotations

import re
from typing import Any

from components.config.data import RewardMode
from components.envs.base import (
    ADMISSIBLE,
    FEEDBACK,
    LOST,
    NORM_SCORE,
    REWARD_WON,
    VALID,
    WON,
    EnvError,
    StepResult,
    step_reward,
)
from components.schema import Task

# reward: 1/0 with reward = "won" (the default), the normalised score gain with "score"
Step = tuple[str, float, bool, bool, dict[str, Any]]
NOT_RUNNING = "step() called before reset() or after the episode ended"
_WS = re.compile(r"\s+")
LOCATION = "location"  # extra info key of the room-based envs: the current room's name
MOVES = "moves"  # extra info key: steps taken in this episode

# Out-of-world commands of interactive-fiction engines (Inform7 / Z-machine) and simulators:
# they end, restart or rewind the session (quit locks the game in a yes/no prompt, restart
# desyncs the tracked state), write files into the working directory (save, script) or
# change how the game prints itself. None is an action of the task, so the envs refuse
# them before they reach the engine (unless the game itself lists one as admissible).
META_VERBS = frozenset(
    {
        "quit", "q", "restart", "reset", "save", "load", "restore", "undo", "script",
        "transcript", "unscript", "noscript", "verbose", "brief", "superbrief", "long",
        "short", "normal", "notify", "verify", "version", "pronouns", "nouns", "fullscore",
    }
)  # fmt: skip
META_PHRASES = frozenset({"full score"})  # commands whose first word alone is no meta-verb
META_PREFIXES = ("tw-",)  # TextWorld's own debug commands (its wrapper reads state with them)
META_FEEDBACK = (
    "That command is not available: game commands such as quit, restart, save, restore or "
    "undo are not part of the task. The game goes on."
)
_WORD = re.compile(r"[a-z][\w-]*")


def collapse(text: str | None) -> str:
    """``text`` on one line: whitespace runs (newlines too) become single spaces."""
    return _WS.sub(" ", text or "").strip()


def normalize_command(command: str) -> str:
    """Canonical form of a command: lower case, single spaces (newlines would inject input)."""
    return collapse(command).lower()


def is_meta_command(command: str, admissible: list[str] | None = None) -> bool:
    """True if ``command`` is a game meta-command (quit, save, undo...) the game did not list."""
    text = normalize_command(command)
    if admissible and text in {normalize_command(a) for a in admissible}:
        return False
    # compare words, not punctuation: "quit." or "save," still reach Inform7's verbs
    words = _WORD.findall(text)
    if not words:
        return False
    verb = words[0]
    return verb in META_VERBS or " ".join(words) in META_PHRASES or verb.startswith(META_PREFIXES)


class EpisodicEnv:
    """Base of the real envs (subclasses: ``reset`` and ``_advance``)."""

    # Deterministic envs continue the live episode when it already sits on a prefix of the
    # replayed one (one step per call instead of a reset plus the whole prefix).
    continue_replay = True

    def __init__(self, max_steps: int, reward: RewardMode = REWARD_WON) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        self.max_steps = max_steps
        self.reward = reward
        self._task: Task | None = None
        self._history: list[str] = []
        self._admissible: list[str] | None = []
        self._done = True
        self._norm_score = 0.0  # the game's normalised score (0-1) after the last step

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode of ``task``."""
        raise NotImplementedError

    def _advance(self, action: str, limit: int | None) -> Step:
        """Apply one action; truncate after ``limit`` steps (None: no limit)."""
        raise NotImplementedError

    def _replay_form(self, action: str) -> str:
        """How the env records ``action`` in its history (to compare replay prefixes)."""
        return action.strip()

    def _require_running(self) -> Task:
        """The running episode's task; RuntimeError before reset or after the end."""
        if self._task is None or self._done:
            raise RuntimeError(NOT_RUNNING)
        return self._task

    def step(self, action: str) -> Step:
        """Apply ``action``; returns (observation, reward, terminated, truncated, info)."""
        return self._advance(action, self.max_steps)

    def _meta_refusal(self, command: str) -> str | None:
        """``META_FEEDBACK`` when ``command`` is a game meta-command the current state does
        not list as admissible (the env refuses it before the engine), else None."""
        return META_FEEDBACK if is_meta_command(command, self._admissible) else None

    def _scored(self, won: bool, norm_score: float) -> float:
        """The step's reward under ``self.reward``; ``norm_score`` becomes the score."""
        previous, self._norm_score = self._norm_score, norm_score
        return step_reward(self.reward, won, norm_score, previous)

    def _room_info(
        self,
        valid: bool,
        won: bool,
        lost: bool,
        feedback: str,
        location: str,
        norm_score: float,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The info of a room-based env's step (TextWorld, ScienceWorld): the shared keys,
        ``LOCATION``, ``MOVES``, the env's ``extra`` keys, then ``NORM_SCORE``."""
        return {
            ADMISSIBLE: list(self._admissible or []),
            VALID: valid,
            WON: won,
            LOST: lost,
            FEEDBACK: feedback,
            LOCATION: location,
            MOVES: len(self._history),
            **(extra or {}),
            NORM_SCORE: norm_score,
        }

    @property
    def admissible_actions(self) -> list[str]:
        """Admissible actions in the current state (empty once terminated or unknown)."""
        return list(self._admissible or [])

    @property
    def history(self) -> list[str]:
        """Actions applied since the last reset."""
        return list(self._history)

    def replay(self, task: Task, action_prefix: list[str], action: str) -> StepResult:
        """Restore the state reached by ``action_prefix`` from reset, apply ``action``.

        Replaces the current episode. ValueError when the prefix ends the episode before
        ``action``; EnvError when the env itself fails.
        """
        prefix = [self._replay_form(a) for a in action_prefix]
        n = len(self._history)
        resume = (
            self.continue_replay
            and self._task is not None
            and self._task.task_id == task.task_id
            and not self._done
            and self._history == prefix[:n]
        )
        if not resume:
            self.reset(task)
            n = 0
        for i in range(n, len(prefix)):
            self._replay_step(prefix[i], i, None)  # no step limit inside the prefix
        return StepResult(*self._replay_step(action, len(prefix), self.max_steps))

    def _replay_step(self, action: str, index: int, limit: int | None) -> Step:
        try:
            return self._advance(action, limit)
        except EnvError:
            raise
        except RuntimeError as err:
            raise ValueError(f"the prefix ends the episode before step {index}") from err
