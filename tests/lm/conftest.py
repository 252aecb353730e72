"""Language-model fixtures: a tokenizer trained on tagged text and two tiny Llamas."""

from __future__ import annotations

import pytest

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
    """A deterministic model: the next token is a fixed function of the last one.

    One Llama layer with zeroed projections is an identity on the residual stream; with
    one-hot embeddings and a permutation-like head, greedy decoding follows
    <state> x </state> <reward> 0 </reward> y y y ... (never eos), and "z" -> eos.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer
    vocab = len(tok)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=vocab,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )
    tag = {
        t: tok.convert_tokens_to_ids(t) for t in ("<state>", "</state>", "<reward>", "</reward>")
    }
    x, zero, y, z = (tok(t, add_special_tokens=False)["input_ids"][0] for t in "x0yz")
    chain = {tag["<state>"]: x, x: tag["</state>"], tag["</state>"]: tag["<reward>"]}
    chain |= {tag["<reward>"]: zero, zero: tag["</reward>"], tag["</reward>"]: y}
    chain |= {z: tok.eos_token_id}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        model.model.norm.weight.fill_(1.0)
        for t in range(vocab):
            model.lm_head.weight[chain.get(t, y), t] = 1.0
    return model.eval()
