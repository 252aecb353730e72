"""Small builders of valid records for tests (real schema, no mocks)."""

from __future__ import annotations

from components.schema import Provenance, Trajectory, Transition, stable_id


def make_trajectory(
    n_steps: int = 3,
    success: bool = True,
    task_id: str = "tw-quest-0",
    policy: str = "expert",
    idx: int = 0,
    split: str = "train",
) -> Trajectory:
    """A consistent trajectory of ``n_steps`` TextWorld-like steps."""
    episode_id = stable_id(task_id, policy, idx)
    states = [
        f"Location: Room {i}\nA plain room.\nInventory: nothing\nFeedback: ok"
        for i in range(n_steps + 1)
    ]
    steps = [
        Transition(
            id=Transition.make_id(episode_id, i),
            task_id=task_id,
            env="textworld",
            episode_id=episode_id,
            step_index=i,
            instruction="Find the key and open the chest.",
            state=states[i],
            action=f"go east {i}",
            next_state=states[i + 1],
            reward=int(success and i == n_steps - 1),
            done=i == n_steps - 1,
            admissible_actions=["go east", "look"],
            valid_action=True,
            source="real",
            provenance=Provenance(policy=policy, seed=idx),
        )
        for i in range(n_steps)
    ]
    return Trajectory(
        episode_id=episode_id,
        task_id=task_id,
        env="textworld",
        split=split,
        source="real",
        policy=policy,
        initial_state=states[0],
        steps=steps,
        success=success,
    )
