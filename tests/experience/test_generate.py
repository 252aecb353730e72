"""Batched generation stops each sequence at </reward> (or eos, or max_new_tokens)."""

from __future__ import annotations

import pytest

from components.lm.generate import Generator, cut_at_stop
from tests.factories import chain_lm


@pytest.fixture(scope="module")
def bigram(tiny_tokenizer):
    """The deterministic chain model (tests/factories.py) on the tiny tokenizer."""
    return chain_lm(tiny_tokenizer)


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
