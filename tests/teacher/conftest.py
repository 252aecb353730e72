"""Fixtures for the teacher tests: records, configs and the fake OpenAI server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.config import Config, TeacherConfig, load_config
from components.schema import Trajectory, Transition, stable_id
from tests.factories import fast_client, make_step, trajectory_of

ROOT = Path(__file__).resolve().parents[2]
SENTINEL_KEY = "sk-SENTINEL-teacher-key-0123456789abcdef"
KEY_ENV = "DREAMGYM_TEST_TEACHER_KEY"
INSTRUCTION = "Find the golden key and put it in the chest in the bedroom."


def make_transition(
    state: str,
    action: str,
    next_state: str,
    *,
    reward: int = 0,
    done: bool = False,
    valid: bool = True,
    admissible: list[str] | None = None,
    step_index: int = 0,
    episode_id: str = "ep-0",
    instruction: str = INSTRUCTION,
) -> Transition:
    """One TextWorld-like transition."""
    return make_step(
        episode_id,
        step_index,
        state,
        action,
        next_state,
        instruction=instruction,
        reward=reward,
        done=done,
        admissible_actions=admissible,
        valid_action=valid,
    )


def make_trajectories(n: int = 3, steps: int = 4) -> list[Trajectory]:
    """``n`` consistent successful episodes of ``steps`` steps, distinct actions."""
    out = []
    for e in range(n):
        episode_id = stable_id("teacher-test", e)
        states = [
            f"Location: Room {i}\nA plain room.\nInventory: item {e}-{i}\nFeedback: step {i}"
            for i in range(steps + 1)
        ]
        transitions = [
            make_transition(
                states[i],
                f"go east {e}-{i}",
                states[i + 1],
                reward=int(i == steps - 1),
                done=i == steps - 1,
                step_index=i,
                episode_id=episode_id,
            )
            for i in range(steps)
        ]
        out.append(trajectory_of(transitions))
    return out


def make_config(**teacher: Any) -> Config:
    """The ci profile's config with the given teacher settings."""
    base = load_config(ROOT / "params.yaml", profile="ci")
    return base.model_copy(update={"teacher": TeacherConfig(**teacher)})


def openai_teacher_config(base_url: str, **overrides: Any) -> TeacherConfig:
    """An openai-backend config with test-sized timeouts and backoffs."""
    # a healthy request must never time out on a loaded 2-core host (0.5 s did: a retry
    # broke the exact request counts); the timeout tests set 1 s against a 3 s delay
    small = {"concurrency": 4, "timeout_s": 5.0, "max_tokens": 64}
    server = {"backend": "openai", "model": "gpt-4o", "base_url": base_url}
    return fast_client(TeacherConfig, KEY_ENV, **{**server, **small, **overrides})


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The sentinel API key, exported in the teacher's key variable."""
    monkeypatch.setenv(KEY_ENV, SENTINEL_KEY)
    return SENTINEL_KEY
