"""The schema records of an episode played on a task (real collection, policy rollouts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.schema import Task, Trajectory, Transition


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


def task_trajectory(
    task: Task, steps: Sequence[Transition], initial_state: str, truncated: bool = False
) -> Trajectory:
    """The episode of ``steps`` (at least one) on ``task``: its split, the steps' episode,
    source and policy; a success when the last step is rewarded."""
    first = steps[0]
    return Trajectory(
        episode_id=first.episode_id,
        task_id=task.task_id,
        env=task.env,
        split=task.split,
        source=first.source,
        policy=first.provenance.policy,
        initial_state=initial_state,
        steps=list(steps),
        success=bool(steps[-1].reward),
        truncated=truncated,
    )
