"""A trivial env for the RL tests: say the magic word (reward 1 if action == target)."""

from __future__ import annotations

from typing import Any

from components.agent.policy import SYSTEM_PROMPT, Observation, render_answer
from components.envs.base import ADMISSIBLE, FEEDBACK, VALID, WON, EnvError
from components.schema import Task
from tests.factories import grpo_config, make_task

WORDS = ("abracadabra", "please", "sesame")
TARGET = "abracadabra"
START = "A closed door. Nothing else."
INSTRUCTION = "Say the magic word to open the door."
ANSWER_TOKENS = 12  # the completion cap the magic-word tests sample with


class MagicWordEnv:
    """Env protocol: the episode is won by saying the task's word; ``max_steps`` tries."""

    name = "magic"

    def __init__(self, max_steps: int = 1, crash_at_step: int | None = None) -> None:
        self.max_steps = max_steps
        self.crash_at_step = crash_at_step  # the "engine" dies at this step of an episode
        self.target = TARGET
        self.steps = 0  # real steps taken by this instance (all episodes)
        self._n = 0

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; the target word is the task's walkthrough."""
        self.target = (task.walkthrough or [TARGET])[0]
        self._n = 0
        return START, {ADMISSIBLE: list(WORDS), FEEDBACK: ""}

    def step(self, action: str) -> tuple[str, int, bool, bool, dict[str, Any]]:
        """Reward 1 and terminate on the target word; truncate after max_steps."""
        self._n += 1
        self.steps += 1
        if self._n == self.crash_at_step:
            raise EnvError("the engine died")
        won = action == self.target
        feedback = "The door opens." if won else "Nothing happens."
        truncated = not won and self._n >= self.max_steps
        info = {ADMISSIBLE: list(WORDS), FEEDBACK: feedback, VALID: action in WORDS, WON: won}
        return f"{START} {feedback}", int(won), won, truncated, info

    def close(self) -> None:
        """Nothing to release."""


def counted(stepped: list[str]) -> type[MagicWordEnv]:
    """``MagicWordEnv`` that appends every action it is stepped with to ``stepped``."""

    class Counted(MagicWordEnv):
        def step(self, action: str) -> tuple[str, int, bool, bool, dict[str, Any]]:
            stepped.append(action)
            return super().step(action)

    return Counted


def probe_tasks() -> list[Task]:
    """Three magic-word tasks with different words (S2R's probe tests)."""
    return [magic_task(i, target=w) for i, w in enumerate(("please", "now", "sesame"))]


def magic_task(i: int = 0, target: str = TARGET) -> Task:
    """A magic-word task."""
    return make_task(f"magic-{i}", INSTRUCTION, i, env="magic", walkthrough=[target])


def magic_grpo(**overrides: Any) -> Any:
    """``grpo_config`` for the magic-word env: completions capped at ``ANSWER_TOKENS``."""
    return grpo_config(max_new_tokens=ANSWER_TOKENS, **overrides)


def first_observation() -> Observation:
    """What the policy sees at the start of a magic-word episode."""
    return Observation(INSTRUCTION, START, (), WORDS)


def corpus() -> list[str]:
    """Texts to train the tiny policy's tokenizer on."""
    return [
        SYSTEM_PROMPT,
        INSTRUCTION,
        f"{START} The door opens. Nothing happens.",
        "Task: Current state: Recent history: Admissible actions: " + "; ".join(WORDS),
        *(render_answer(w, None) for w in WORDS),
    ] * 10
