"""The Triton decode-attention kernel equals plain torch (CUDA only: CI skips these)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference(qkv, cos, sin, k_cache, v_cache, valid, col, *, n_heads, kv_heads, head_dim) -> Any:
    """Rotary, the cache write and masked GQA attention of one decode step, in float32."""
    rows, d, c = qkv.shape[0], head_dim, int(col)
    qk = qkv[:, : (n_heads + kv_heads) * d].view(rows, n_heads + kv_heads, d).float()
    qk = qk * cos[:, None].float() + qk.roll(d // 2, dims=-1) * sin[:, None].float()
    k_cache[:, :, c] = qk[:, n_heads:].to(k_cache.dtype)
    v_cache[:, :, c] = qkv[:, (n_heads + kv_heads) * d :].view(rows, kv_heads, d)
    q = qk[:, :n_heads].to(k_cache.dtype).float().view(rows, kv_heads, -1, d)
    keys, values = k_cache[:, :, : c + 1].float(), v_cache[:, :, : c + 1].float()
    keep = valid[:, : c + 1].clone()
    keep[:, c] = True  # the new token is always attended
    scores = (q @ keys.transpose(-1, -2)).masked_fill(~keep[:, None, None, :], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ values
    return out.reshape(rows, n_heads * d).to(qkv.dtype)


def _inputs(rows, n_heads, kv_heads, d, capacity, dtype, pads):
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    qkv = randn(rows, (n_heads + 2 * kv_heads) * d)
    angle = torch.rand(rows, d // 2, device="cuda", generator=g) * 6.28
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(dtype)
    sin = torch.cat([-angle.sin(), angle.sin()], -1).to(dtype)
    valid = torch.ones(rows, capacity, dtype=torch.bool, device="cuda")
    for row, pad in enumerate(pads):  # left padding, as the decoder lays prompts out
        valid[row, :pad] = False
    return (
        qkv,
        cos,
        sin,
        randn(rows, kv_heads, capacity, d),
        randn(rows, kv_heads, capacity, d),
        valid,
    )


@pytest.mark.parametrize(
    ("dtype", "tol", "col"),
    [(torch.float32, 1e-5, 0), (torch.float32, 1e-5, 700), (torch.bfloat16, 4e-2, 333)],
)
def test_kernel_matches_plain_torch_and_writes_the_new_key_and_value(dtype, tol, col):
    from components.lm.decode_attention import decode_attention

    dims = {"n_heads": 9, "kv_heads": 3, "head_dim": 64}  # SmolLM2-135M's attention
    qkv, cos, sin, k, v, valid = _inputs(5, 9, 3, 64, 1024, dtype, [0, 1, 63, 200, col])
    at = torch.tensor([col], device="cuda")
    k2, v2 = k.clone(), v.clone()
    out = decode_attention(qkv, cos, sin, k, v, valid, at, **dims)
    ref = reference(qkv, cos, sin, k2, v2, valid, at, **dims)
    assert torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)
    assert torch.allclose(k[:, :, col].float(), k2[:, :, col].float(), atol=tol, rtol=tol)
    assert torch.equal(v[:, :, col], v2[:, :, col])
    assert torch.equal(k[:, :, col + 1 :], k2[:, :, col + 1 :])  # nothing else written


def test_graph_decoder_with_the_kernel_equals_the_torch_attention():
    from components.lm.graph_decode import GraphDecoder
    from tests.lm.tiny import tiny_llama

    model = tiny_llama(hidden_size=96, num_attention_heads=6).cuda()
    ids = torch.randint(0, 300, (3, 20), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    mask[2, :15] = 0

    def greedy(logits):
        return logits.argmax(-1), torch.log_softmax(logits.float(), -1).amax(-1)

    out = {}
    for attention, micro in (("torch", 1), ("triton", 1), ("triton", 2)):
        dec = GraphDecoder(model, 4, 64, bucket=16, attention=attention, micro_batches=micro)
        assert dec.attention == attention
        with torch.no_grad():
            out[attention, micro] = dec.generate(ids, mask, max_new_tokens=30, pick=greedy)
    for key in (("triton", 1), ("triton", 2)):  # two streams in one graph: same tokens too
        assert torch.equal(out["torch", 1][0], out[key][0])
        assert torch.allclose(out["torch", 1][1], out[key][1], atol=1e-4)
    assert GraphDecoder(model, 4, 64).attention == "triton"  # the CUDA default
