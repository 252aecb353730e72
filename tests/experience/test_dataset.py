"""SFT examples: ablation switches, split discipline and no leakage of the own episode."""

from __future__ import annotations

import pytest

from components.experience.dataset import (
    PromptSettings,
    buffer_retriever,
    build_examples,
    select_transitions,
    settings_for,
)
from components.experience.format import parse_answer
from tests.experience.conftest import pool_retriever
from tests.factories import make_trajectory


def _pool(trajectories):
    return [s for t in trajectories if t.split == "train" for s in t.steps]


def test_full_method_prompt_has_history_retrieval_and_reasoning(train_examples):
    later = next(ex for ex in train_examples if ex.step_index == 2)
    user = later.messages[1]["content"]
    assert later.messages[0]["role"] == "system"
    assert "Recent history:" in user and "Similar past transitions:" in user
    assert user.count("- action:") == 2  # history_len = 2 steps
    parsed = parse_answer(later.answer, with_reasoning=True)
    assert parsed.next_state == later.next_state.strip() and parsed.reward == later.reward
    assert later.to_sft()["completion"] == [{"role": "assistant", "content": later.answer}]


@pytest.mark.parametrize(
    ("switch", "absent"),
    [
        ("no_history", "Recent history:"),
        ("no_replay", "Similar past transitions:"),
        ("no_reasoning", "<think>"),
    ],
)
def test_ablation_switches(trajectories, reasoning, switch, absent):
    settings = settings_for(
        2, 3, **{s: s == switch for s in ("no_history", "no_replay", "no_reasoning")}
    )
    calls = []

    def retriever(queries, k):
        calls.append(k)
        return pool_retriever(_pool(trajectories))(queries, k)

    examples, _ = build_examples(
        select_transitions(trajectories, "train"),
        settings,
        reasoning,
        retriever if settings.k else None,
    )
    text = "\n".join(ex.messages[1]["content"] + ex.answer for ex in examples)
    assert absent not in text
    if switch == "no_replay":
        assert settings.k == 0 and calls == []
    if switch == "no_reasoning":
        assert all(parse_answer(ex.answer, with_reasoning=False) for ex in examples)


def test_train_and_validation_splits_stay_apart(trajectories):
    train = select_transitions(trajectories, "train")
    val = select_transitions(trajectories, "validation")
    assert {t.split for t, _ in train} == {"train"} and {t.split for t, _ in val} == {"validation"}
    assert len(select_transitions(trajectories, "train", limit=5, seed=1)) == 5
    assert select_transitions(trajectories, "train", 5, 1) == select_transitions(
        trajectories, "train", 5, 1
    )


def test_own_episode_is_never_retrieved(trajectories, reasoning):
    examples, stats = build_examples(
        select_transitions(trajectories, "train"),
        PromptSettings(history_len=0, k=2),
        reasoning,
        pool_retriever(_pool(trajectories), leaky=True),
    )
    assert stats["leaks_dropped"] > 0
    for ex in examples:
        assert ex.episode_id not in ex.retrieved_episodes
        assert len(ex.retrieved_ids) <= 2


def test_buffer_backed_retrieval_excludes_own_episode(tmp_path, trajectories, reasoning):
    from components.buffer import ReplayBuffer, WordLlamaEmbedder
    from components.config import BufferConfig

    buf = ReplayBuffer.open(tmp_path / "buf", BufferConfig(k=3), embedder=WordLlamaEmbedder())
    buf.add(_pool(trajectories))
    examples, stats = build_examples(
        select_transitions(trajectories, "train"),
        PromptSettings(history_len=1, k=3),
        reasoning,
        buffer_retriever(buf, env="textworld"),
    )
    assert stats["leaks_dropped"] == 0
    assert all(len(ex.retrieved_ids) == 3 for ex in examples)
    assert all(ex.episode_id not in ex.retrieved_episodes for ex in examples)


def test_missing_reasoning_is_skipped_for_training_kept_for_evaluation(trajectories, reasoning):
    pairs = select_transitions(trajectories, "validation")
    partial = dict(list(reasoning.items())[:3])
    settings = PromptSettings(history_len=1, k=0)
    train, stats = build_examples(pairs, settings, partial)
    assert stats["missing_reasoning"] == len(pairs) - len(train) > 0
    evaluation, _ = build_examples(pairs, settings, partial, require_reasoning=False)
    assert len(evaluation) == len(pairs)
    with pytest.raises(ValueError, match="retriever"):
        build_examples(pairs, PromptSettings(k=1), reasoning)


def test_min_success_share_keeps_the_rare_wins_in_a_subset() -> None:
    # 10 episodes of 10 steps, one win each: 10% of the steps are reward 1
    trajs = [make_trajectory(n_steps=10, idx=i) for i in range(10)]

    def wins(pairs) -> int:
        return sum(t.steps[i].reward for t, i in pairs)

    plain = select_transitions(trajs, "train", limit=20, seed=0)
    balanced = select_transitions(trajs, "train", limit=20, seed=0, min_success_share=0.25)
    assert len(balanced) == 20 and len(set(map(_key, balanced))) == 20  # no duplicates
    assert wins(balanced) == 5 and wins(plain) < 5
    # asking for more wins than exist takes them all, and the subset stays full
    greedy = select_transitions(trajs, "train", limit=20, seed=0, min_success_share=0.9)
    assert wins(greedy) == 10 and len(set(map(_key, greedy))) == 20
    # no limit: every step, whatever the share
    assert len(select_transitions(trajs, "train", min_success_share=0.5)) == 100


def _key(pair) -> str:
    return pair[0].steps[pair[1]].id
