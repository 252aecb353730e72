"""The memory-bandwidth roofline of LM decoding: what a step must read, and the share of
the GPU's peak bandwidth a measured step achieves.

A decode step is bandwidth-bound: it reads every weight matrix once and the KV cache of
every row, and does little arithmetic per byte. ``roofline_fraction`` = (bytes a step
must read / its measured time) / the GPU's peak bandwidth; 1.0 is the hardware limit.
Only the bytes the step needs count (no padding, no re-reads), so the fraction never
flatters a decoder that reads more than it must.
"""

from __future__ import annotations

from typing import Any

# Peak HBM bandwidth in bytes/s by GPU name (substring match on torch's lower-cased device
# name, the first match wins: a name that contains another comes before it); vendor
# datasheet figures.
PEAK_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("gh200", 4.0e12),  # before "h200", which its name contains
    ("h200", 4.8e12),
    ("h100 nvl", 3.9e12),
    ("h100 pcie", 2.0e12),
    ("h100", 3.35e12),  # SXM (HBM3)
    ("a100-sxm4-80gb", 2.039e12),
    ("a100 80gb pcie", 1.935e12),
    ("a100", 1.555e12),  # 40 GB
    ("l40", 0.864e12),  # L40 and L40S; before "l4"
    ("a10g", 0.6e12),
    ("l4", 0.3e12),
    ("rtx 4090", 1.008e12),
)


def peak_bandwidth(device_name: str) -> float | None:
    """Peak memory bandwidth (bytes/s) of a GPU from its name, or None if unknown."""
    low = device_name.lower()
    return next((bw for key, bw in PEAK_BANDWIDTH if key in low), None)


def weight_bytes_per_step(model: Any) -> int:
    """Bytes of the weights one decode step reads: all of them but an untied input
    embedding, of which a step looks up only its rows' tokens."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embed:  # tied: the LM head reads it in full
        total -= embed.numel() * embed.element_size()
    return total


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of keys and values one cached token holds over all layers."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    elem = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem


def decode_bytes_per_step(model: Any, batch: int, context: float) -> float:
    """Bytes a decode step must read: the weights once + the KV cache of every row
    (``context``: the mean cached tokens per row over the steps)."""
    return weight_bytes_per_step(model) + batch * context * kv_bytes_per_token(model)


def roofline_fraction(bytes_per_step: float, step_s: float, peak_bytes_per_s: float) -> float:
    """Achieved decode bandwidth as a share of the peak: (bytes / step time) / peak."""
    return bytes_per_step / step_s / peak_bytes_per_s
