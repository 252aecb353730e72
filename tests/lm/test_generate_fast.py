"""Fast, static-cache and reference generation agree; stop strings end answers early."""

from __future__ import annotations

import pytest

from components.lm.generate import (
    Completion,
    GenerationBackend,
    Generator,
    cut_at_stop,
    score_tokens,
    torch_threads,
)

PROMPTS = [
    "<state>You are in the kitchen.",
    "The agent takes the key in the garden and then",
    [{"role": "user", "content": "You carry an apple."}],
    "<think>",
    "You are in the cellar. You carry the lamp. The agent takes a coin in the attic.",
    [{"role": "system", "content": "Predict."}, {"role": "user", "content": "a map"}],
]
GREEDY = {"max_new_tokens": 24, "stop": ("</state>", "</reward>")}
SCORED = {**GREEDY, "logprobs": True}


def test_fast_and_static_agree_with_the_reference_under_greedy_decoding(random_model, tokenizer):
    ref = Generator(random_model, tokenizer, fast=False).complete(PROMPTS, **SCORED)
    assert Generator(random_model, tokenizer, fast=False).path == "reference"
    # one batch of different lengths (left padding), and small batches (several calls)
    for batch_size in (8, 4):
        fast = Generator(random_model, tokenizer).complete(PROMPTS, batch_size=batch_size, **SCORED)
        assert [c.text for c in fast] == [c.text for c in ref]
        assert [c.token_ids for c in fast] == [c.token_ids for c in ref]
        assert [c.finish_reason for c in fast] == [c.finish_reason for c in ref]
        for f, r in zip(fast, ref, strict=True):
            assert f.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    static = Generator(random_model, tokenizer, static_cache=True, compile=False)
    assert static.path == "static"
    out = static.complete(PROMPTS, batch_size=8, **GREEDY)
    assert [c.text for c in out] == [c.text for c in ref]
    assert len({c.text for c in ref}) > 3  # the prompts really lead to different answers


def test_generate_returns_the_texts_of_complete(random_model, tokenizer):
    gen = Generator(random_model, tokenizer)
    assert isinstance(gen, GenerationBackend)
    texts = gen.generate(PROMPTS, batch_size=3, **GREEDY)
    assert texts == [c.text for c in gen.complete(PROMPTS, batch_size=3, **GREEDY)]
    assert gen.generate([], **GREEDY) == []


def test_a_row_leaves_the_batch_at_its_stop_string_and_the_batch_ends_early(chain_model, tokenizer):
    gen = Generator(chain_model, tokenizer)
    # row 0 reaches </reward> after 6 tokens, row 1 loops on "y", row 2 hits eos at once
    out = gen.complete(
        ["some words <state>", "y", "z"], max_new_tokens=40, stop=("</reward>",), batch_size=3
    )
    assert out[0] == Completion(
        "x</state><reward>0</reward>", out[0].token_ids, out[0].logprobs, "stop", 5
    )
    assert (out[1].text, out[1].finish_reason, out[1].n_tokens) == ("y" * 40, "length", 40)
    assert (out[2].text, out[2].finish_reason, out[2].n_tokens) == ("", "eos", 1)
    # alone, the stopping row costs 5 decode steps, not max_new_tokens
    (alone,) = gen.complete(["<state>"], max_new_tokens=500, stop=("</reward>",))
    assert (alone.n_tokens, alone.finish_reason) == (5, "stop")


def test_stop_strings_spanning_tokens_cut_at_the_earliest(chain_model, tokenizer):
    gen = Generator(chain_model, tokenizer)
    out = gen.generate(["<state>"] * 2, max_new_tokens=30, stop=("0</reward>", "x</state>"))
    assert out == ["x</state>", "x</state>"]
    ref = Generator(chain_model, tokenizer, fast=False)
    assert ref.generate(["<state>"], max_new_tokens=30, stop=("0</reward>",)) == [
        "x</state><reward>0</reward>"
    ]
    assert gen.generate(["<state>"], max_new_tokens=4, stop=()) == ["x</state><reward>0"]


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone(random_model, tokenizer):
    import torch

    gen = Generator(random_model, tokenizer)
    kw = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "stop": (), "seed": 3}
    assert gen.complete(PROMPTS[:1], **kw)[0].logprobs == ()  # only on request
    before = torch.random.get_rng_state()
    first = gen.complete(PROMPTS, logprobs=True, **kw)
    assert torch.equal(before, torch.random.get_rng_state())
    assert [c.text for c in gen.complete(PROMPTS, **kw)] == [c.text for c in first]
    other = gen.generate(PROMPTS, **{**kw, "seed": 4})
    assert other != [c.text for c in first]
    # sampled logprobs are those of the tokens under logits / temperature
    prompt = tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    ids, mask = gen._left_pad([prompt], len(prompt))
    (scored,) = score_tokens(random_model, ids, mask, [first[0].token_ids], temperature=1.0)
    assert scored == pytest.approx(list(first[0].logprobs), abs=1e-4)


def test_threads_are_restored_after_generation(random_model, tokenizer):
    import torch

    before = torch.get_num_threads()
    Generator(random_model, tokenizer, threads=1).generate(PROMPTS[:2], **GREEDY)
    assert torch.get_num_threads() == before
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_the_model_keeps_its_training_mode(random_model, tokenizer):
    random_model.train()
    try:
        Generator(random_model, tokenizer).generate(PROMPTS[:1], **GREEDY)
        assert random_model.training
    finally:
        random_model.eval()


def test_cut_at_stop_keeps_the_earliest_stop():
    assert cut_at_stop("a</reward>b</reward>", ["</reward>"]) == "a</reward>"
    assert cut_at_stop("a</state>b</reward>", ["</reward>", "</state>"]) == "a</state>"
    assert cut_at_stop("abc", ["</reward>"]) == "abc"


@pytest.mark.integration
def test_static_cache_path_agrees_with_the_reference_on_cpu(random_model, tokenizer):
    """The CUDA path's static cache forced onto the CPU: same answers. Without
    torch.compile here (inductor's C++ build takes minutes on 2 cores); the CUDA test
    below checks the compiled path."""
    ref = Generator(random_model, tokenizer, fast=False).generate(PROMPTS[:3], **GREEDY)
    gen = Generator(random_model, tokenizer, static_cache=True, compile=False)
    # 2 prompts in a batch of 2, then 1 padded to 2: one compiled shape serves both calls
    assert gen.generate(PROMPTS[:3], batch_size=2, **GREEDY) == ref


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")
def test_cuda_defaults_to_the_graph_path_and_every_path_agrees(random_model, tokenizer):
    import copy

    model = copy.deepcopy(random_model).to("cuda")
    assert Generator(model, tokenizer).path == "graph"
    ref = Generator(model, tokenizer, fast=False).generate(PROMPTS, **GREEDY)
    assert Generator(model, tokenizer).generate(PROMPTS, batch_size=4, **GREEDY) == ref
    gen = Generator(model, tokenizer, graph=False)
    assert (gen.path, gen.compile) == ("static", True)
    ref = Generator(model, tokenizer, fast=False).generate(PROMPTS, **GREEDY)
    assert gen.generate(PROMPTS, batch_size=4, **GREEDY) == ref
    fast = Generator(model, tokenizer, graph=False, static_cache=False).generate(PROMPTS, **GREEDY)
    assert fast == ref


@pytest.mark.parametrize("name", ["multi_gpu.yaml", "deepspeed_zero2.yaml"])
def test_accelerate_configs_load_with_accelerate(name):
    from pathlib import Path

    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(Path(__file__).parents[2] / "configs" / "accelerate" / name))
    assert cfg.mixed_precision == "bf16" and cfg.num_processes >= 1
