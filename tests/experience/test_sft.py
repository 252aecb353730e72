"""SFT of a tiny model: answer-only loss, it learns, and an interrupted run resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import ExperienceConfig
from components.experience.sft import (
    completion_loss,
    fit_length,
    make_trainer,
    prepare_checkpoints,
    train_sft,
)
from components.lm.models import build_tiny_model

CFG = ExperienceConfig(
    model="tiny",
    tiny_preset="nano",
    max_length=1024,
    max_steps=30,
    max_train_minutes=None,
    batch_size=4,
    learning_rate=5e-3,
    warmup_ratio=0.0,
    logging_steps=5,
    save_steps=1000,
)


def test_prompt_tokens_are_masked_and_the_answer_is_trained(
    tmp_path, train_examples, tiny_tokenizer
):
    model = build_tiny_model("nano", tiny_tokenizer)
    trainer, fit = make_trainer(model, tiny_tokenizer, train_examples[:2], CFG, tmp_path)
    assert fit.dropped == fit.shrunk == 0
    tok = tiny_tokenizer
    for row, ex in zip(trainer.train_dataset, train_examples[:2], strict=False):
        prompt = tok.apply_chat_template(ex.prompt(), tokenize=False, add_generation_prompt=True)
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        labels = row["labels"]
        assert all(label == -100 for label in labels[:n_prompt])
        trained = [label for label in labels if label != -100]
        assert len(trained) == len(labels) - n_prompt
        # reasoning + state + reward + end of turn, nothing of the prompt
        assert tok.decode(trained) == ex.answer + tok.eos_token + "\n"


def test_a_few_steps_change_parameters_and_lower_train_loss(
    tmp_path, train_examples, tiny_tokenizer
):
    import torch

    model = build_tiny_model("nano", tiny_tokenizer, seed=1)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loss_before = completion_loss(model, tiny_tokenizer, train_examples)
    trained, result = train_sft(
        model, tiny_tokenizer, train_examples, CFG, tmp_path / "ckpt", fingerprint={"t": 1}
    )
    loss_after = completion_loss(trained, tiny_tokenizer, train_examples)
    changed = [k for k, v in trained.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)
    assert result.steps == CFG.max_steps and result.n_train == len(train_examples)
    assert loss_after < 0.7 * loss_before
    assert result.last_loss < result.first_loss


def test_interrupted_training_resumes_from_its_checkpoint(tmp_path, train_examples, tiny_tokenizer):
    ckpt = tmp_path / "ckpt"
    budget = CFG.model_copy(update={"max_steps": 4, "max_train_minutes": 1e-6})
    _, first = train_sft(
        build_tiny_model("nano", tiny_tokenizer),
        tiny_tokenizer,
        train_examples,
        budget,
        ckpt,
        fingerprint={"run": "a"},
    )
    assert first.stopped_by_time_budget and first.steps == 1
    assert (ckpt / "checkpoint-1").exists()
    _, second = train_sft(
        build_tiny_model("nano", tiny_tokenizer),
        tiny_tokenizer,
        train_examples,
        CFG.model_copy(update={"max_steps": 4}),
        ckpt,
        fingerprint={"run": "a"},
    )
    assert second.resumed_from is not None and second.resumed_from.endswith("checkpoint-1")
    assert second.steps == 4 and not second.stopped_by_time_budget
    # another run's fingerprint wipes the checkpoints instead of resuming them
    assert prepare_checkpoints(ckpt, {"run": "b"}) is None
    assert not list(ckpt.glob("checkpoint-*"))


def test_too_long_examples_lose_far_neighbours_then_are_dropped(train_examples, tiny_tokenizer):
    from components.experience.sft import sequence_length

    ex = train_examples[0]
    assert len(ex.retrieved_ids) == 1
    bare = sequence_length(tiny_tokenizer, ex.with_retrieved(0))
    full = sequence_length(tiny_tokenizer, ex)
    kept, dropped, shrunk = fit_length(tiny_tokenizer, [ex], max_length=bare)
    assert (dropped, shrunk) == (0, 1) and kept[0].retrieved_ids == ()
    assert "Similar past transitions" not in kept[0].messages[1]["content"]
    assert kept[0].answer == ex.answer  # the answer is never cut
    assert fit_length(tiny_tokenizer, [ex], max_length=full) == ([ex], 0, 0)
    assert fit_length(tiny_tokenizer, [ex], max_length=bare - 1) == ([], 1, 0)
    with pytest.raises(ValueError, match="max_length"):
        make_trainer(
            build_tiny_model("nano", tiny_tokenizer),
            tiny_tokenizer,
            train_examples,
            CFG.model_copy(update={"max_length": 64}),
            Path("unused"),
        )
