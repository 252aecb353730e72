"""The bookkeeping every real env shares: step limit, running check, replay by prefix."""

from __future__ import annotations

from typing import Any

import pytest

from components.envs.base import ADMISSIBLE, EnvError
from components.envs.episodic import EpisodicEnv, Step, collapse, normalize_command
from components.schema import Task
from tests.factories import make_task

TASK = make_task("count-0", "Count to three, then win.", env="counter")


class CounterEnv(EpisodicEnv):
    """A deterministic toy env: ``inc`` counts, ``win`` ends the episode, ``crash`` fails."""

    name = "counter"

    def __init__(self, max_steps: int, continue_replay: bool = True) -> None:
        super().__init__(max_steps)
        self.continue_replay = continue_replay
        self.resets = 0
        self.count = 0

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start counting from zero."""
        self.resets += 1
        self._task, self._history, self._done, self.count = task, [], False, 0
        self._admissible = ["inc", "win"]
        return "count 0", {ADMISSIBLE: self.admissible_actions}

    def _advance(self, action: str, limit: int | None) -> Step:
        self._require_running()
        command = collapse(action)
        if command == "crash":
            raise EnvError("the engine died")
        self._history.append(command)
        self.count += command == "inc"
        won = command == "win"
        truncated = not won and limit is not None and len(self._history) >= limit
        self._done = won or truncated
        self._admissible = [] if won else ["inc", "win"]
        return (
            f"count {self.count}",
            int(won),
            won,
            truncated,
            {ADMISSIBLE: self.admissible_actions},
        )


def test_step_limit_and_the_running_check():
    with pytest.raises(ValueError, match="max_steps"):
        CounterEnv(max_steps=0)
    env = CounterEnv(max_steps=2)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("inc")
    env.reset(TASK)
    assert env.step("inc")[3] is False
    assert env.step("inc")[3] is True  # truncated at the limit
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("inc")
    assert env.history == ["inc", "inc"]


def test_replay_continues_the_live_episode_only_when_it_sits_on_the_prefix():
    env = CounterEnv(max_steps=10)
    actions = ["inc", "inc\n", "inc", "win"]
    results = [env.replay(TASK, actions[:i], actions[i]) for i in range(len(actions))]
    assert env.resets == 1  # in order: one step per call ("inc\n" is recorded as "inc")
    assert [r.observation for r in results] == ["count 1", "count 2", "count 3", "count 3"]
    assert results[-1].reward == 1 and results[-1].terminated
    assert env.replay(TASK, ["inc"], "inc").observation == "count 2"  # ended: a reset
    assert env.resets == 2
    remote = CounterEnv(max_steps=10, continue_replay=False)
    for i in range(3):
        remote.replay(TASK, actions[:i], actions[i])
    assert remote.resets == 3  # a non-deterministic env always starts over


def test_replay_past_the_end_is_a_value_error_and_env_errors_pass_through():
    env = CounterEnv(max_steps=10)
    with pytest.raises(ValueError, match="before step 1"):
        env.replay(TASK, ["win"], "inc")  # the prefix already ended the episode
    with pytest.raises(ValueError, match="before step 1"):
        env.replay(TASK, ["win", "inc"], "inc")
    with pytest.raises(EnvError, match="engine died"):
        env.replay(TASK, ["inc", "crash"], "inc")
    # the replayed last step truncates exactly as live stepping would
    short = CounterEnv(max_steps=2)
    assert short.replay(TASK, ["inc", "inc", "inc"], "inc").observation == "count 4"
    assert short.replay(TASK, ["inc"], "inc").truncated


def test_commands_are_collapsed_and_normalised():
    assert collapse("  go\n\teast  ") == "go east"
    assert collapse(None) == ""
    assert normalize_command("Take  KEY\n") == "take key"
