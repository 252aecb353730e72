"""The schema record of a step played on a task (real collection, policy rollouts)."""

from __future__ import annotations

from typing import Any

from components.schema import Task, Transition


def task_transition(
    task: Task,
    episode_id: str,
    step_index: int,
    state: str,
    action: str,
    next_state: str,
    **fields: Any,
) -> Transition:
    """Step ``step_index`` of episode ``episode_id`` on ``task`` (its id, env and
    instruction); ``fields``: the reward, done, validity, source, provenance..."""
    return Transition(
        id=Transition.make_id(episode_id, step_index),
        task_id=task.task_id,
        env=task.env,
        episode_id=episode_id,
        step_index=step_index,
        instruction=task.instruction,
        state=state,
        action=action,
        next_state=next_state,
        **fields,
    )
