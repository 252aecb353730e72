"""Batched generation stops each sequence at </reward> (or eos, or max_new_tokens)."""

from __future__ import annotations

import pytest

from components.lm.generate import Generator, cut_at_stop


@pytest.fixture(scope="module")
def bigram(tiny_tokenizer):
    """A deterministic model: the next token is a fixed function of the last one.

    One Llama layer with zeroed output projections is an identity on the residual
    stream; with one-hot embeddings and a permutation-like head, greedy decoding follows
    the chain <state> x </state> <reward> 0 </reward> y y y ... (never eos).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer
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
    ids = {
        t: tok.convert_tokens_to_ids(t) for t in ("<state>", "</state>", "<reward>", "</reward>")
    }
    x, zero, y = (tok(t, add_special_tokens=False)["input_ids"][0] for t in ("x", "0", "y"))
    chain = {ids["<state>"]: x, x: ids["</state>"], ids["</state>"]: ids["<reward>"]}
    chain |= {ids["<reward>"]: zero, zero: ids["</reward>"], ids["</reward>"]: y}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        model.model.norm.weight.fill_(1.0)
        for t in range(vocab):
            model.lm_head.weight[chain.get(t, y), t] = 1.0
    return model


def test_generation_stops_at_the_closing_reward_tag(bigram, tiny_tokenizer):
    gen = Generator(bigram, tiny_tokenizer)
    # two prompts at different points of the chain, different lengths: left padding
    out = gen.generate(["some words <state>", "<reward>"], max_new_tokens=20, batch_size=2)
    assert out == ["x</state><reward>0</reward>", "0</reward>"]


def test_without_a_stop_string_max_new_tokens_caps_the_answer(bigram, tiny_tokenizer):
    out = Generator(bigram, tiny_tokenizer).generate(["<reward>"], max_new_tokens=5, stop=())
    assert out == ["0</reward>yyy"]


def test_chat_prompts_are_rendered_with_the_generation_prompt(bigram, tiny_tokenizer):
    msgs = [{"role": "user", "content": "hi"}]
    out = Generator(bigram, tiny_tokenizer).generate([msgs], max_new_tokens=3, stop=())
    assert out == ["yyy"]  # "assistant\n" is followed by the chain's default token


def test_cut_at_stop_keeps_the_earliest_stop():
    assert cut_at_stop("a</reward>b</reward>", ["</reward>"]) == "a</reward>"
    assert cut_at_stop("abc", ["</reward>"]) == "abc"
