"""The one interface every environment implements, real or synthetic.

Gymnasium 5-tuple semantics over text: ``reset(task) -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``. Observations are
compact abstract states (short text), never raw transcripts. ``info`` uses the keys
below. Real environments also implement ``replay`` so the experience model's predictions
can be checked against the true simulator (fidelity: eps_R, eps_P).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

from components.config.data import RewardMode
from components.schema import Task, write_jsonl

# info keys shared by every env (no magic strings elsewhere)
ADMISSIBLE = "admissible_actions"  # list[str] | None: actions the env accepts now
VALID = "valid_action"  # bool: was the last action admissible
WON = "won"  # bool: task completed
LOST = "lost"  # bool: the game is lost (dead end)
FEEDBACK = "feedback"  # str: the env's direct response to the last action
NORM_SCORE = "norm_score"  # float: the game's own score / its max score (0 if it has none)

# env.reward: what step() returns as reward (both WON and NORM_SCORE are in the info)
REWARD_WON: Final[RewardMode] = "won"  # 1 on the step that wins, else 0 (the default)
REWARD_SCORE: Final[RewardMode] = "score"  # the step's gain of NORM_SCORE

TASKS_FILE = "tasks.jsonl"  # every env's task suite, in the generate-tasks stage's out dir


def step_won(info: Mapping[str, Any], reward: float) -> bool:
    """Whether a step won: the env's ``WON`` flag; ``reward > 0`` for an env without one.

    With ``env.reward = score`` a partial score gain is a reward, not a win.
    """
    return bool(info[WON]) if WON in info else reward > 0


def step_reward(mode: RewardMode, won: bool, norm_score: float, previous: float) -> float:
    """The reward of a step under ``mode``: 1/0 for winning, or the normalised score gain."""
    return norm_score - previous if mode == REWARD_SCORE else int(won)


def normalised_score(score: float | None, max_score: float | None) -> float:
    """``score / max_score``; 0 for a game without a score (goal-less games have none)."""
    return float(score or 0) / max_score if max_score else 0.0


class EnvError(RuntimeError):
    """The environment process failed (crash, bad game file); the episode is a failure."""


@dataclass(frozen=True)
class StepResult:
    """The real outcome of one action."""

    observation: str
    reward: float  # 1/0 with env.reward = won (the default), the score gain with score
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """Episode over, for any reason."""
        return self.terminated or self.truncated


@runtime_checkable
class Env(Protocol):
    """A text environment with Gymnasium 5-tuple semantics."""

    name: str

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode of ``task``; returns the initial abstract state and info."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply ``action``; returns (observation, reward, terminated, truncated, info)."""
        ...

    def close(self) -> None:
        """Release processes and files."""
        ...


@runtime_checkable
class ReplayableEnv(Env, Protocol):
    """A real env that can restore any reachable state to check a prediction."""

    def replay(self, task: Task, action_prefix: list[str], action: str) -> StepResult:
        """Restore the state reached by ``action_prefix`` from reset, apply ``action``."""
        ...


def write_task_suite(out_dir: Path, tasks: list[Task]) -> None:
    """Write ``out_dir/tasks.jsonl`` whole or not at all (a temporary file, then a rename)."""
    tasks_file = Path(out_dir) / TASKS_FILE
    tmp = tasks_file.with_name(TASKS_FILE + ".tmp")
    write_jsonl(tmp, tasks)
    os.replace(tmp, tasks_file)
