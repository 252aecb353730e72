"""Experience-model fixtures: a few TextWorld-like episodes, their traces, a tiny LM."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from components.experience.dataset import (
    ExperienceExample,
    PromptSettings,
    build_examples,
    corpus,
    select_transitions,
)
from components.schema import Trajectory, Transition
from tests.factories import make_trajectory


@pytest.fixture(scope="session")
def trajectories() -> list[Trajectory]:
    """Six train and two validation episodes over two tasks."""
    out = [
        make_trajectory(n_steps=4, success=i % 2 == 0, task_id=f"tw-quest-{i % 2}", idx=i)
        for i in range(6)
    ]
    out += [
        make_trajectory(n_steps=3, task_id="tw-quest-9", idx=100 + i, split="validation")
        for i in range(2)
    ]
    return out


@pytest.fixture(scope="session")
def reasoning(trajectories: list[Trajectory]) -> dict[str, str]:
    """A teacher trace for every transition."""
    return {
        s.id: f"The agent does '{s.action}' at step {s.step_index}: it is admissible."
        for t in trajectories
        for s in t.steps
    }


def pool_retriever(pool: Sequence[Transition], leaky: bool = False):
    """A deterministic Retriever over ``pool``; ``leaky`` also offers the query's own episode."""

    def retrieve(queries: Sequence[Transition], k: int) -> list[list[Transition]]:
        return [
            [t for t in pool if leaky or t.episode_id != q.episode_id][: k + 1 if leaky else k]
            for q in queries
        ]

    return retrieve


@pytest.fixture(scope="session")
def train_examples(trajectories, reasoning) -> list[ExperienceExample]:
    """Full-method examples (history 2, k = 1) of the train split."""
    pool = [s for t in trajectories if t.split == "train" for s in t.steps]
    examples, _ = build_examples(
        select_transitions(trajectories, "train"),
        PromptSettings(history_len=2, k=1, with_reasoning=True),
        reasoning,
        pool_retriever(pool),
    )
    return examples


@pytest.fixture(scope="session")
def tiny_tokenizer(train_examples):
    """A BPE tokenizer trained on the examples (about a second)."""
    from components.lm.tokenizer import train_tokenizer

    return train_tokenizer(corpus(train_examples), vocab_size=400)
