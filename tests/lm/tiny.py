"""A random tiny Llama for the decode tests that also run on GPU machines, where the
project's test dependencies (and so its conftest fixtures) are missing."""

from __future__ import annotations

from typing import Any


def tiny_llama(**overrides: Any) -> Any:
    """A seeded 2-layer Llama with grouped-query attention and well-separated logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "initializer_range": 0.2,  # greedy decoding has no near-ties
    }
    return LlamaForCausalLM(LlamaConfig(**(fields | overrides))).eval()
