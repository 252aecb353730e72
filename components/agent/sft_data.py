"""SFT examples for the policy: behaviour cloning of successful offline train trajectories.

One example per step of a successful real trajectory of the train split: the prompt is
``render_prompt`` of (task, last ``history_len`` (action, feedback) steps, state,
admissible actions), the completion is ``render_answer`` of the recorded action with
``expert_reasoning``. Validation and test trajectories are never used for training:
they are filtered out here and counted. The observation builders (``observation_at``,
``feedback_of``) are shared with evaluation so a policy sees the same prompt shape
offline and live.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from components.agent.policy import (
    FEEDBACK_PREFIX,
    SYSTEM_PROMPT,
    Observation,
    PolicySettings,
    expert_reasoning,
    feedback_of,
    render_answer,
    render_prompt,
)
from components.experience.format import ChatExample
from components.schema import Trajectory, Transition

TRAIN_SPLIT = "train"
USABLE_SPLITS = ("train", "validation")  # never "test"
__all__ = ["feedback_of", "observation_at", "state_core"]


def state_core(state: str) -> str:
    """The state without its feedback line: equal cores mean the action changed nothing."""
    return "\n".join(ln for ln in state.splitlines() if not ln.startswith(FEEDBACK_PREFIX))


def history_of(steps: Sequence[Transition]) -> tuple[tuple[str, str], ...]:
    """The (action, resulting state) pairs of an episode prefix."""
    return tuple((s.action, s.next_state) for s in steps)


def observation_at(traj: Trajectory, i: int, settings: PolicySettings | None = None) -> Observation:
    """What the policy saw before step ``i`` of a recorded trajectory (as live, see
    ``Observation``; ``settings`` only decide what a prompt shows of it)."""
    del settings
    step = traj.steps[i]
    return Observation(
        instruction=step.instruction,
        state=step.state,
        history=history_of(traj.steps[:i]),
        admissible=tuple(step.admissible_actions) if step.admissible_actions else None,
        initial_state=traj.initial_state,
    )


def answer_for(action: str, admissible: Sequence[str] | None, settings: PolicySettings) -> str:
    """The training target for taking ``action`` (with a truthful reasoning if enabled)."""
    reasoning = expert_reasoning(action, admissible) if settings.with_reasoning else None
    return render_answer(action, reasoning)


@dataclass(frozen=True)
class PolicyExample(ChatExample):
    """One (prompt, answer) pair of the SFT baseline."""

    id: str  # the transition id
    episode_id: str
    task_id: str
    step_index: int
    policy: str  # the collecting policy of the trajectory
    messages: tuple[dict[str, str], ...]  # system + user
    answer: str  # kept whole or dropped by components.experience.sft.fit_length, never cut


def cloned_trajectories(
    trajectories: Iterable[Trajectory],
    policies: Sequence[str] | None = None,
    split: str = TRAIN_SPLIT,
) -> tuple[list[Trajectory], dict[str, int]]:
    """Successful real trajectories of ``split`` (and ``policies``), and what was left out.

    ``split`` is ``train`` for training data, ``validation`` for a held-out eval loss;
    the test split is refused: it exists only for the final evaluation.
    """
    if split not in USABLE_SPLITS:
        raise ValueError(f"split {split!r} cannot feed training or tuning; use {USABLE_SPLITS}")
    kept: list[Trajectory] = []
    stats = {"trajectories": 0, "other_split": 0, "failed": 0, "other_policy": 0}
    for traj in trajectories:
        if traj.split != split or traj.source != "real":
            stats["other_split"] += 1
        elif not traj.success:
            stats["failed"] += 1
        elif policies is not None and traj.policy not in policies:
            stats["other_policy"] += 1
        else:
            kept.append(traj)
    stats["trajectories"] = len(kept)
    return kept, stats


def build_sft_examples(
    trajectories: Iterable[Trajectory],
    settings: PolicySettings,
    *,
    policies: Sequence[str] | None = None,
    skip_invalid: bool = True,
    limit: int | None = None,
    seed: int = 0,
    split: str = TRAIN_SPLIT,
) -> tuple[list[PolicyExample], dict[str, int]]:
    """SFT examples from successful trajectories of ``split``, and counts of what was dropped.

    ``skip_invalid`` drops steps whose action the env rejected (they stay in the history
    of later steps, as the policy would see them). ``limit`` keeps a seeded random subset.
    """
    kept, stats = cloned_trajectories(trajectories, policies, split)
    examples: list[PolicyExample] = []
    stats["invalid_steps_skipped"] = 0
    for traj in kept:
        for i, step in enumerate(traj.steps):
            if skip_invalid and not step.valid_action:
                stats["invalid_steps_skipped"] += 1
                continue
            examples.append(example_at(traj, i, settings))
    stats["steps"] = len(examples)
    if limit is not None and limit < len(examples):
        examples = random.Random(seed).sample(examples, limit)
    stats["examples"] = len(examples)
    return examples, stats


def example_at(traj: Trajectory, i: int, settings: PolicySettings) -> PolicyExample:
    """The SFT example of step ``i`` of a trajectory (its recorded action as the target)."""
    step = traj.steps[i]
    obs = observation_at(traj, i, settings)
    return PolicyExample(
        id=step.id,
        episode_id=traj.episode_id,
        task_id=traj.task_id,
        step_index=i,
        policy=traj.policy,
        messages=tuple(render_prompt(obs, settings)),
        answer=answer_for(step.action, obs.admissible, settings),
    )


def corpus(examples: Iterable[PolicyExample]) -> Iterator[str]:
    """Texts to train a tokenizer on: system prompt, prompt and answer of each example."""
    yield SYSTEM_PROMPT
    for ex in examples:
        yield ex.messages[-1]["content"]
        yield ex.answer
