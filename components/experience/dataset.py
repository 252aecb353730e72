"""SFT and evaluation examples for the experience model.

One example per real transition: the prompt is the system prompt plus ``render_prompt``
of (task, last ``history_len`` steps, state, action, k retrieved transitions); the
completion is ``render_answer`` with the teacher's reasoning (no ``<think>`` in the
w/o-reasoning ablation). Train examples come from the train split only, evaluation
examples from the validation split; retrieved neighbours never come from the example's
own episode (that would leak the answer).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from components.experience.format import (
    STATE_FULL,
    SYSTEM_PROMPT,
    ChatExample,
    StepContext,
    history_pairs,
    render_answer,
    render_prompt,
)
from components.schema import Trajectory, Transition

# Batched retrieval: for each query transition, up to k neighbours (never from the
# query's own episode). Batched because embedding queries one by one is slow.
Retriever = Callable[[Sequence[Transition], int], list[list[Transition]]]


@dataclass(frozen=True)
class PromptSettings:
    """What the experience model sees and answers (fixed at training, reused at inference)."""

    history_len: int = 2
    k: int = 3
    with_reasoning: bool = True
    state_target: str = STATE_FULL  # format.STATE_TARGETS: whole next state or its changes

    def as_dict(self) -> dict[str, Any]:
        """Plain data (saved next to the trained model)."""
        return asdict(self)


@dataclass(frozen=True)
class ExperienceExample(ChatExample):
    """One (prompt, answer) pair with the ground truth needed to score predictions."""

    id: str
    episode_id: str
    task_id: str
    step_index: int
    messages: tuple[dict[str, str], ...]  # system + user
    answer: str  # the training target
    state: str
    action: str
    next_state: str
    reward: int
    valid_action: bool = True
    retrieved_ids: tuple[str, ...] = ()
    retrieved_episodes: tuple[str, ...] = ()
    context: StepContext | None = field(default=None, repr=False)
    state_target: str = STATE_FULL

    def with_retrieved(self, n: int) -> ExperienceExample:
        """The same example keeping only its ``n`` nearest retrieved transitions."""
        if self.context is None:
            raise ValueError("example was built without its StepContext")
        ctx = replace(self.context, retrieved=self.context.retrieved[:n])
        return replace(
            self,
            messages=(
                self.messages[0],
                {"role": "user", "content": render_prompt(ctx, self.state_target)},
            ),
            retrieved_ids=self.retrieved_ids[:n],
            retrieved_episodes=self.retrieved_episodes[:n],
            context=ctx,
        )


def buffer_retriever(buffer: Any, env: str | None = None) -> Retriever:
    """A Retriever backed by the replay buffer (``ReplayBuffer.retrieve_many``)."""

    def retrieve(queries: Sequence[Transition], k: int) -> list[list[Transition]]:
        hits = buffer.retrieve_many(
            list(queries), k, env=env, exclude_episodes=[q.episode_id for q in queries]
        )
        return [[t for t, _ in row] for row in hits]

    return retrieve


def settings_for(
    history_len: int,
    k: int,
    *,
    no_history: bool,
    no_replay: bool,
    no_reasoning: bool,
    state_target: str = STATE_FULL,
) -> PromptSettings:
    """Prompt settings after the ablation switches."""
    return PromptSettings(
        history_len=0 if no_history else history_len,
        k=0 if no_replay else k,
        with_reasoning=not no_reasoning,
        state_target=state_target,
    )


def select_transitions(
    trajectories: Iterable[Trajectory],
    split: str,
    limit: int | None = None,
    seed: int = 0,
    min_success_share: float = 0.0,
) -> list[tuple[Trajectory, int]]:
    """(trajectory, step index) pairs of one split; a seeded random subset when ``limit``.

    ``min_success_share`` keeps at least that share of the subset on reward-1 steps (as
    many as exist, never duplicated): success is ~5% of real steps, and a model that
    never saw enough of it never predicts it, so the synthetic env never rewards.
    """
    pairs = [(traj, i) for traj in trajectories if traj.split == split for i in range(traj.n_steps)]
    if limit is None or limit >= len(pairs):
        return pairs
    rng = random.Random(seed)
    if min_success_share <= 0:
        return rng.sample(pairs, limit)
    wins = [p for p in pairs if p[0].steps[p[1]].reward == 1]
    rest = [p for p in pairs if p[0].steps[p[1]].reward != 1]
    n_wins = min(len(wins), math.ceil(limit * min_success_share))
    chosen = rng.sample(wins, n_wins) + rng.sample(rest, min(len(rest), limit - n_wins))
    if len(chosen) < limit:  # too few others: fill with the remaining wins
        chosen += rng.sample([p for p in wins if p not in chosen], limit - len(chosen))
    rng.shuffle(chosen)
    return chosen


def build_examples(
    pairs: Sequence[tuple[Trajectory, int]],
    settings: PromptSettings,
    reasoning: Mapping[str, str] | None = None,
    retriever: Retriever | None = None,
    *,
    require_reasoning: bool = True,
    batch_size: int = 256,
) -> tuple[list[ExperienceExample], dict[str, int]]:
    """Examples for the given steps, and counts (built, missing reasoning, leaks dropped).

    ``reasoning`` maps transition id -> teacher trace. For training (``require_reasoning``)
    a step without a trace is skipped and counted; for evaluation the step is kept and its
    reference answer simply has no ``<think>`` (only state and reward are scored).
    Retrieved transitions from the step's own episode are dropped defensively (counted as
    ``leaks_dropped``).
    """
    if settings.k > 0 and retriever is None:
        raise ValueError("k > 0 needs a retriever (or use the no_replay ablation)")
    need = settings.with_reasoning and require_reasoning
    if need and reasoning is None:
        raise ValueError("training with reasoning needs the teacher annotations")
    stats = {"examples": 0, "missing_reasoning": 0, "leaks_dropped": 0}
    kept: list[tuple[Trajectory, int]] = []
    for traj, i in pairs:
        if need and traj.steps[i].id not in (reasoning or {}):
            stats["missing_reasoning"] += 1
            continue
        kept.append((traj, i))
    examples: list[ExperienceExample] = []
    for start in range(0, len(kept), batch_size):
        chunk = kept[start : start + batch_size]
        queries = [traj.steps[i] for traj, i in chunk]
        neighbours = (
            retriever(queries, settings.k)
            if settings.k > 0 and retriever is not None
            else [[] for _ in chunk]
        )
        for (traj, i), hits in zip(chunk, neighbours, strict=True):
            clean = [t for t in hits if t.episode_id != traj.episode_id]
            stats["leaks_dropped"] += len(hits) - len(clean)
            clean = clean[: settings.k]
            examples.append(_example(traj, i, settings, reasoning, clean))
    stats["examples"] = len(examples)
    return examples, stats


def _example(
    traj: Trajectory,
    i: int,
    settings: PromptSettings,
    reasoning: Mapping[str, str] | None,
    retrieved: list[Transition],
) -> ExperienceExample:
    step = traj.steps[i]
    ctx = StepContext(
        instruction=step.instruction,
        state=step.state,
        action=step.action,
        history=history_pairs(traj.steps[:i], settings.history_len),
        retrieved=tuple(retrieved),
    )
    trace = (reasoning or {}).get(step.id) if settings.with_reasoning else None
    answer = render_answer(
        step.next_state, step.reward, trace, state=step.state, state_target=settings.state_target
    )
    return ExperienceExample(
        id=step.id,
        episode_id=traj.episode_id,
        task_id=traj.task_id,
        step_index=i,
        messages=(
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": render_prompt(ctx, settings.state_target)},
        ),
        answer=answer,
        state=step.state,
        action=step.action,
        next_state=step.next_state,
        reward=step.reward,
        valid_action=step.valid_action,
        retrieved_ids=tuple(t.id for t in retrieved),
        retrieved_episodes=tuple(t.episode_id for t in retrieved),
        context=ctx,
        state_target=settings.state_target,
    )


def corpus(examples: Iterable[ExperienceExample]) -> Iterator[str]:
    """Texts to train a tokenizer on: system prompt, prompt and answer of each example."""
    yield SYSTEM_PROMPT
    for ex in examples:
        yield ex.messages[1]["content"]
        yield ex.answer
