"""Language-model fixtures: a tokenizer trained on tagged text and two tiny Llamas."""

from __future__ import annotations

import pytest

from tests.factories import chain_lm

TEXTS = [
    f"<think>The agent takes {thing} in the {room}.</think><state>You are in the {room}. "
    f"You carry {thing}.</state><reward>{i % 2}</reward>"
    for i, (thing, room) in enumerate(
        (t, r)
        for t in ("the key", "an apple", "a map", "the lamp", "a coin")
        for r in ("kitchen", "garden", "cellar", "attic")
    )
]


@pytest.fixture(scope="session")
def tokenizer():
    """A byte-level BPE tokenizer with the answer tags as single tokens (about a second)."""
    from components.lm.tokenizer import train_tokenizer

    return train_tokenizer(TEXTS * 5, vocab_size=300)


@pytest.fixture(scope="session")
def random_model(tokenizer):
    """A random tiny Llama with well-separated logits (greedy decoding has no near-ties)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,  # grouped-query attention, like the hub models
            initializer_range=0.2,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    )
    return model.eval()


@pytest.fixture(scope="session")
def chain_model(tokenizer):
    """The deterministic chain model (tests/factories.py) on the test tokenizer."""
    return chain_lm(tokenizer)
