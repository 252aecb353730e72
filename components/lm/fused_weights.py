"""A Llama-family model's weights as the graph decoder reads them (components/lm/graph_decode.py).

Which models qualify (``supports``: Llama / Qwen2, SiLU, biases only on q/k/v), and per
layer one buffer of fused q/k/v weights (attention's 1/sqrt(d) folded into q), one of fused
gate/up, and o / down; a peft LoRA model's adapter delta is added to its base weights, so
the model itself is never merged or modified. ``copy_fused`` writes into the same buffers
each time: captured CUDA graphs that read them stay valid while a policy trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_TYPES = ("llama", "qwen2")


def supports(model: Any) -> bool:
    """Whether ``model`` is a Llama-family causal LM this decoder implements."""
    cfg = getattr(model, "config", None)
    inner = getattr(base_model(model), "model", None)
    return (
        cfg is not None
        and inner is not None
        and getattr(cfg, "model_type", None) in SUPPORTED_TYPES
        and getattr(cfg, "hidden_act", "silu") == "silu"
        and not getattr(cfg, "use_sliding_window", False)
        and hasattr(inner, "rotary_emb")
        and not getattr(cfg, "mlp_bias", False)
        and all(_biases_supported(layer) for layer in getattr(inner, "layers", ()))
    )


def _biases_supported(layer: Any) -> bool:
    """Whether ``layer`` has biases only where the decode step adds them (q/k/v, all or none).

    o_proj and MLP biases (Llama's ``attention_bias`` / ``mlp_bias``) are not carried:
    such a model decodes on the other paths rather than silently without them.
    """
    a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    try:
        qkv = [lora_weight(p)[1] is not None for p in (a.q_proj, a.k_proj, a.v_proj)]
        rest = [
            lora_weight(p)[1] is not None for p in (a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        ]
    except AttributeError:  # another layout than Llama's
        return False
    return len(set(qkv)) == 1 and not any(rest)


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def lora_weight(linear: Any) -> tuple[Any, Any]:
    """(weight, bias) of a Linear as used in the forward pass: a LoRA delta included."""
    base = getattr(linear, "base_layer", linear)
    weight, bias = base.weight, base.bias
    lora = hasattr(linear, "get_delta_weight") and not getattr(linear, "merged", False)
    if lora and not getattr(linear, "disable_adapters", False):
        for name in getattr(linear, "active_adapters", ()):
            if name in getattr(linear, "lora_A", {}):
                weight = weight + linear.get_delta_weight(name)
    return weight, bias


@dataclass
class FusedLayer:
    """One layer's weights as the decode step reads them (q/k/v and gate/up fused)."""

    qkv: Any
    qkv_bias: Any
    o: Any
    gate_up: Any
    down: Any
    ln1: Any
    ln2: Any


def fused_buffers(layer: Any, dtype: Any, device: Any) -> FusedLayer:
    """Empty fused buffers for ``layer`` (fill them with ``copy_fused``); norms are shared."""
    import torch

    a, m = layer.self_attn, layer.mlp
    qkv = [lora_weight(p) for p in (a.q_proj, a.k_proj, a.v_proj)]
    has_bias = qkv[0][1] is not None

    def empty(*tensors: Any) -> Any:
        rows = sum(t.shape[0] for t in tensors)
        return torch.empty((rows, *tensors[0].shape[1:]), dtype=dtype, device=device)

    return FusedLayer(
        qkv=empty(*(w for w, _ in qkv)),
        qkv_bias=empty(*(b for _, b in qkv)) if has_bias else None,
        o=empty(lora_weight(a.o_proj)[0]),
        gate_up=empty(lora_weight(m.gate_proj)[0], lora_weight(m.up_proj)[0]),
        down=empty(lora_weight(m.down_proj)[0]),
        ln1=layer.input_layernorm.weight,
        ln2=layer.post_attention_layernorm.weight,
    )


def copy_fused(dst: FusedLayer, layer: Any, scaling: float) -> None:
    """Copy ``layer``'s current weights (LoRA deltas added) into ``dst``, q scaled."""
    import torch

    with torch.no_grad():
        a, m = layer.self_attn, layer.mlp
        qkv = [lora_weight(p) for p in (a.q_proj, a.k_proj, a.v_proj)]
        q_rows = qkv[0][0].shape[0]
        torch.cat([w for w, _ in qkv], out=dst.qkv)
        dst.qkv[:q_rows].mul_(scaling)  # attention's 1/sqrt(d) folded into q
        if dst.qkv_bias is not None:
            torch.cat([b for _, b in qkv], out=dst.qkv_bias)
            dst.qkv_bias[:q_rows].mul_(scaling)
        dst.o.copy_(lora_weight(a.o_proj)[0])
        torch.cat([lora_weight(m.gate_proj)[0], lora_weight(m.up_proj)[0]], out=dst.gate_up)
        dst.down.copy_(lora_weight(m.down_proj)[0])
