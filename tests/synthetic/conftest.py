"""Synthetic-env fixtures: TextWorld-like episodes, a tiny LM overfitted on them, a buffer.

The tiny model is trained for a few seconds with a plain torch loop on the experience
model's own SFT records (prompt + answer, loss on the answer), until greedy decoding
reproduces the answers: enough for multi-step synthetic episodes that are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from components.experience.dataset import (
    PromptSettings,
    build_examples,
    corpus,
    select_transitions,
)
from components.experience.synthetic_env import RealStateIndex
from components.schema import Provenance, Task, Trajectory, Transition, stable_id
from tests.factories import make_step, make_task, make_trajectory

INSTRUCTION = "Find the key and open the chest."
INVALID_ACTION = "dance wildly"
SETTINGS = PromptSettings(history_len=2, k=1, with_reasoning=True)


def episode(n_steps: int, success: bool, task_id: str, idx: int) -> Trajectory:
    """A factory episode whose admissible actions at room i are ``go east i`` and ``look``."""
    traj = make_trajectory(n_steps=n_steps, success=success, task_id=task_id, idx=idx)
    steps = [
        s.model_copy(update={"admissible_actions": [f"go east {s.step_index}", "look"]})
        for s in traj.steps
    ]
    return traj.model_copy(update={"steps": steps})


def invalid_trajectory(task_id: str = "tw-quest-0", idx: int = 50) -> Trajectory:
    """An episode whose first action is inadmissible: the state stays the same, reward 0."""
    base = episode(n_steps=2, success=False, task_id=task_id, idx=idx)
    s0 = base.steps[0]
    bad = s0.model_copy(
        update={
            "action": INVALID_ACTION,
            "next_state": s0.state,
            "valid_action": False,
        }
    )
    second = base.steps[1].model_copy(update={"state": s0.state})
    return base.model_copy(update={"steps": [bad, second]})


def pool_retriever(pool: Sequence[Transition]):
    """A deterministic Retriever: the first k pool transitions not of the query's episode."""

    def retrieve(queries: Sequence[Transition], k: int) -> list[list[Transition]]:
        return [[t for t in pool if t.episode_id != q.episode_id][:k] for q in queries]

    return retrieve


@pytest.fixture(scope="session")
def trajectories() -> list[Trajectory]:
    """Six successful/failed train episodes over two tasks, plus one with an invalid action."""
    out = [episode(4, i % 2 == 0, f"tw-quest-{i % 2}", i) for i in range(6)]
    return [*out, invalid_trajectory()]


@pytest.fixture(scope="session")
def pool(trajectories) -> list[Transition]:
    """Every real transition (the retrieval pool)."""
    return [s for t in trajectories for s in t.steps]


@pytest.fixture(scope="session")
def tasks() -> list[Task]:
    """The two known tasks of the fixture episodes."""
    return [make_task(f"tw-quest-{i}", INSTRUCTION, i) for i in range(2)]


@pytest.fixture(scope="session")
def index(trajectories) -> RealStateIndex:
    """Initial states and admissible actions of the fixture episodes."""
    return RealStateIndex.from_trajectories(trajectories)


@pytest.fixture(scope="session")
def tiny_lm(trajectories, pool) -> tuple[Any, Any]:
    """(model, tokenizer): a nano Llama overfitted on the fixture's SFT records (~10 s)."""
    import torch

    from components.lm.models import build_tiny_model
    from components.lm.tokenizer import train_tokenizer

    reasoning = {
        s.id: (
            f"'{s.action}' is not admissible: nothing changes."
            if not s.valid_action
            else f"'{s.action}' is admissible: the agent moves on."
        )
        for s in pool
    }
    examples, _ = build_examples(
        select_transitions(trajectories, "train"), SETTINGS, reasoning, pool_retriever(pool)
    )
    tok = train_tokenizer(corpus(examples), vocab_size=400)
    model = build_tiny_model("nano", tok, max_position_embeddings=1024, seed=0)
    seqs = []
    for ex in examples:
        rec = ex.to_sft()
        prompt = tok.apply_chat_template(rec["prompt"], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(rec["prompt"] + rec["completion"], tokenize=False)
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        seqs.append((tok(full, add_special_tokens=False)["input_ids"], n_prompt))
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(30):
        for start in range(0, len(seqs), 8):
            batch = seqs[start : start + 8]
            width = max(len(s) for s, _ in batch)
            ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s, _ in batch])
            lengths = torch.tensor([len(s) for s, _ in batch])
            attention = (torch.arange(width)[None] < lengths[:, None]).long()
            labels = ids.clone()
            labels[attention == 0] = -100
            for j, (_, n_prompt) in enumerate(batch):
                labels[j, :n_prompt] = -100
            loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model, tok


@pytest.fixture(scope="session")
def wordllama():
    """The fast packaged embedder (loaded once per session)."""
    from components.buffer import WordLlamaEmbedder

    emb = WordLlamaEmbedder()
    emb.embed(["warm up"])
    return emb


@pytest.fixture
def seed_buffer(tmp_path: Path, wordllama, pool):
    """A real LanceDB buffer holding the fixture's real transitions, tagged ``seed``."""
    from components.buffer import ReplayBuffer
    from components.config import BufferConfig

    buf = ReplayBuffer.open(
        tmp_path / "buffer", BufferConfig(embedder="wordllama", k=1), embedder=wordllama
    )
    buf.add(pool)
    buf.tag("seed")
    return buf


def answer_for(state: str, reward: int = 0) -> str:
    """A well-formed experience-model answer (for scripted backends)."""
    return f"<think>It follows.</think><state>{state}</state><reward>{reward}</reward>"


def synthetic_transition(i: int, iteration: int) -> Transition:
    """A synthetic transition record (for buffer tests)."""
    episode = stable_id("synthetic-test", iteration, i)
    return make_step(
        episode,
        0,
        "Location: Attic\nA dusty attic.\nInventory: nothing\nFeedback: ok",
        "open trunk",
        "Location: Attic\nAn open trunk.\nInventory: nothing\nFeedback: opened",
        instruction=INSTRUCTION,
        source="synthetic",
        provenance=Provenance(policy="grpo", iteration=iteration, checkpoint="ckpt"),
    )
