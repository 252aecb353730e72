"""The graph decode path (our static-cache decode step) agrees with transformers."""

from __future__ import annotations

import pytest

from components.lm.fused_weights import supports
from components.lm.generate import Generator
from components.lm.graph_decode import GraphDecoder, decoder_for
from tests.lm.test_generate_fast import GREEDY, PROMPTS, SCORED


def _assert_same(out, ref, logprobs=True):
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    assert [c.text for c in out] == [c.text for c in ref]
    assert [c.finish_reason for c in out] == [c.finish_reason for c in ref]
    if logprobs:
        for o, r in zip(out, ref, strict=True):
            assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_graph_path_matches_the_reference_token_for_token(random_model, tokenizer):
    ref = Generator(random_model, tokenizer, fast=False).complete(PROMPTS, **SCORED)
    gen = Generator(random_model, tokenizer, graph=True)
    assert gen.path == "graph"
    # one batch of mixed lengths; then batches of 4 (the last one has spare rows)
    for batch_size in (8, 4):
        _assert_same(gen.complete(PROMPTS, batch_size=batch_size, **SCORED), ref)
    assert len({c.text for c in ref}) > 3


def test_the_cpu_default_stays_on_the_fast_path(random_model, tokenizer):
    assert supports(random_model)
    assert Generator(random_model, tokenizer).path == "fast"


def _qwen2(tokenizer):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # q/k/v biases (zero at init) must be used too
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    return model


def test_qwen2_with_qkv_bias_matches_the_reference(tokenizer):
    model = _qwen2(tokenizer)
    ref = Generator(model, tokenizer, fast=False).complete(PROMPTS, **GREEDY)
    _assert_same(
        Generator(model, tokenizer, graph=True).complete(PROMPTS, batch_size=8, **GREEDY),
        ref,
        logprobs=False,
    )


def test_lora_deltas_are_decoded_and_refreshed_each_call(random_model, tokenizer):
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(random_model),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    gen = Generator(model, tokenizer, graph=True)
    assert gen.path == "graph"
    before = gen.complete(PROMPTS, batch_size=8, **GREEDY)
    _assert_same(
        before, Generator(random_model, tokenizer, fast=False).complete(PROMPTS, **GREEDY), False
    )
    with torch.no_grad():  # a trained adapter: B no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ref = Generator(model, tokenizer, fast=False).complete(PROMPTS, **GREEDY)
    after = gen.complete(PROMPTS, batch_size=8, **GREEDY)
    _assert_same(after, ref, logprobs=False)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


def test_seeded_sampling_is_reproducible_and_scored(random_model, tokenizer):
    from components.lm.generate import score_tokens

    gen = Generator(random_model, tokenizer, graph=True)
    kw = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "stop": (), "seed": 3}
    first = gen.complete(PROMPTS, logprobs=True, **kw)
    assert [c.token_ids for c in gen.complete(PROMPTS, **kw)] == [c.token_ids for c in first]
    prompt = tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    ids, mask = gen._left_pad([prompt], len(prompt))
    (scored,) = score_tokens(random_model, ids, mask, [first[0].token_ids], temperature=1.0)
    assert scored == pytest.approx(list(first[0].logprobs), abs=1e-4)


def test_decoders_are_reused_until_a_call_needs_more_room(random_model):
    cache: dict = {}
    a = decoder_for(cache, random_model, 4, 100, bucket=64)
    assert decoder_for(cache, random_model, 4, 120, bucket=64) is a
    b = decoder_for(cache, random_model, 4, 200, bucket=64)
    assert b is not a and b.capacity == 256 and list(cache.values()) == [b]
    with pytest.raises(ValueError, match="holds 4 rows x 256"):
        import torch

        ids = torch.zeros((5, 10), dtype=torch.long)
        b.generate(ids, torch.ones_like(ids), max_new_tokens=4, pick=lambda x: (x, None))


def test_unsupported_models_are_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    assert not supports(model)
    with pytest.raises(ValueError, match="unsupported model type 'gpt2'"):
        GraphDecoder(model, 2, 64)


def test_two_micro_batches_decode_exactly_like_one_batch(random_model, tokenizer):
    """The rows split in two independent halves (two CUDA streams on a GPU): same tokens."""
    import torch

    gen = Generator(random_model, tokenizer)
    texts = [p for p in PROMPTS if isinstance(p, str)][:4]
    encoded = [tokenizer.encode(t) for t in texts]
    ids, mask = gen._left_pad(encoded, max(map(len, encoded)))

    def greedy(logits):
        return logits.argmax(-1), torch.log_softmax(logits.float(), -1).amax(-1)

    out = {}
    for micro in (1, 2):
        dec = GraphDecoder(random_model, 4, 64, bucket=16, micro_batches=micro)
        with torch.no_grad():
            out[micro] = dec.generate(ids, mask, max_new_tokens=12, pick=greedy)
    assert torch.equal(out[1][0], out[2][0])
    assert torch.allclose(out[1][1], out[2][1], atol=1e-5)
    with pytest.raises(ValueError, match="micro_batches"):
        GraphDecoder(random_model, 3, 64, micro_batches=2)


@pytest.mark.parametrize("bias", ["attention_bias", "mlp_bias"])
def test_o_proj_and_mlp_biases_fall_back_to_another_path(bias, tokenizer):
    """The decode step has no o_proj/MLP bias: such a model is refused, not decoded without."""
    import torch

    from tests.lm.tiny import tiny_llama

    model = tiny_llama(vocab_size=len(tokenizer), **{bias: True})
    with torch.no_grad():  # zero at init: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    assert not supports(model)
    with pytest.raises(ValueError, match="biases outside q/k/v"):
        GraphDecoder(model, 2, 64)
