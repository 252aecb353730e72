"""One decode step's attention as a single Triton kernel (rotary, cache write, GQA, mask).

Why: at batch 256 and short contexts a decode step of a small model is bound by kernel
count, not bytes (bench/results/gpu_decode.json). The eager attention of
``graph_decode`` takes ~8 kernels a layer (rotary, two cache writes, two matmuls, mask,
softmax, reshape). This kernel does all of it in one pass per (row, kv head):

- rotary on the new token's query heads and key (``x cos + rotate_half(x) sin``);
- the new key and value written into the static cache at column ``col``;
- attention of the group's query heads over the cached columns ``< col`` that the row's
  ``valid`` mask keeps, plus the new token itself (online softmax, keys and values read
  once for the whole group: no per-query-head repeat);
- the output written as ``(rows, heads * head_dim)``, ready for the output projection.

``col`` is read on the device, so one captured CUDA graph serves every step (the loop
stops at ``col``; nothing is padded to a bucket). The query rows come pre-scaled by
``1/sqrt(head_dim)`` (``GraphDecoder.refresh_weights``).

Triton is imported inside the functions: it ships with CUDA builds of torch, and the CPU
path never needs it.
"""

from __future__ import annotations

import os
from typing import Any

_KERNEL: Any = None


def available() -> bool:
    """Whether Triton can be imported (CUDA builds of torch ship it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _kernel() -> Any:
    """The Triton kernel, defined on first use (no Triton import at module import)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    # tile width and warps chosen by timing on first use per cache shape: the best
    # differs between short and long contexts and between GPUs
    configs = [
        triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=st)
        for n in (32, 64, 128)
        for w in (2, 4)
        for st in (2, 3)
    ]
    if os.environ.get("TRITON_INTERPRET") == "1":  # the CPU interpreter cannot time configs
        configs = configs[6:7]  # BLOCK_N 64, 4 warps, 2 stages

    @triton.autotune(configs=configs, key=["H", "KV", "D", "stride_kh", "IEEE"])
    @triton.jit
    def decode_attention_kernel(
        qkv_ptr,  # (rows, (H + 2 KV) * D): the new token's q, k, v (q pre-scaled)
        cos_ptr,  # (rows, D)
        sin_ptr,  # (rows, D): sin with rotate_half's sign folded in ([-sin, sin])
        k_ptr,  # (rows, KV, capacity, D) one layer's key cache
        v_ptr,
        valid_ptr,  # (rows, capacity) bool as uint8
        col_ptr,  # (1,) the column the new token takes
        out_ptr,  # (rows, H * D)
        stride_qkv,
        stride_cs,
        stride_kb,
        stride_kh,
        stride_kn,
        stride_vb,
        stride_vh,
        stride_vn,
        stride_valid,
        stride_out,
        H: tl.constexpr,
        KV: tl.constexpr,
        D: tl.constexpr,
        GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        row = tl.program_id(0)
        kvh = tl.program_id(1)
        col = tl.load(col_ptr)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        offs_r = (offs_d + D // 2) % D  # rotate_half: the other half, sign in sin
        d_ok = offs_d < D
        g_ok = offs_g < GROUP
        cos = tl.load(cos_ptr + row * stride_cs + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_cs + offs_d, mask=d_ok, other=0.0).to(tl.float32)

        base = qkv_ptr + row * stride_qkv
        heads = kvh * GROUP + offs_g
        q_ok = g_ok[:, None] & d_ok[None, :]
        q = tl.load(base + heads[:, None] * D + offs_d[None, :], mask=q_ok, other=0.0)
        q_rot = tl.load(base + heads[:, None] * D + offs_r[None, :], mask=q_ok, other=0.0)
        q = q.to(tl.float32) * cos[None, :] + q_rot.to(tl.float32) * sin[None, :]
        k_src = base + (H + kvh) * D
        k_new = tl.load(k_src + offs_d, mask=d_ok, other=0.0).to(tl.float32) * cos
        k_new += tl.load(k_src + offs_r, mask=d_ok, other=0.0).to(tl.float32) * sin
        v_new = tl.load(base + (H + KV + kvh) * D + offs_d, mask=d_ok, other=0.0)

        k_base = k_ptr + row * stride_kb + kvh * stride_kh
        v_base = v_ptr + row * stride_vb + kvh * stride_vh
        # the cache holds the model's dtype: round the new key as the cache would
        k_new = k_new.to(k_ptr.dtype.element_ty)
        tl.store(k_base + col * stride_kn + offs_d, k_new, mask=d_ok)
        tl.store(v_base + col * stride_vn + offs_d, v_new, mask=d_ok)
        q_in = q.to(k_ptr.dtype.element_ty)

        m_i = tl.full((BLOCK_G,), -1.0e30, dtype=tl.float32)
        l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
        offs_n = tl.arange(0, BLOCK_N)
        for start in range(0, col, BLOCK_N):
            cols = start + offs_n
            keep = tl.load(valid_ptr + row * stride_valid + cols, mask=cols < col, other=0) != 0
            kv_ok = keep[:, None] & d_ok[None, :]
            k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
            if IEEE:
                s = tl.dot(q_in, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q_in, tl.trans(k))
            s = tl.where(keep[None, :], s, -1.0e30)
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            p = tl.where(keep[None, :], p, 0.0)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        # the new token (always attended): from registers, in the cache's precision
        s_new = tl.sum(q_in.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1)
        m_new = tl.maximum(m_i, s_new)
        alpha = tl.exp(m_i - m_new)
        p_new = tl.exp(s_new - m_new)
        l_i = l_i * alpha + p_new
        acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
        out = acc / l_i[:, None]
        dst = out_ptr + row * stride_out + heads[:, None] * D + offs_d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=q_ok)

    _KERNEL = decode_attention_kernel
    return _KERNEL


def decode_attention(
    qkv: Any,
    cos: Any,
    sin: Any,
    k_cache: Any,
    v_cache: Any,
    valid: Any,
    col: Any,
    *,
    n_heads: int,
    kv_heads: int,
    head_dim: int,
) -> Any:
    """Attention output ``(rows, n_heads * head_dim)`` of one decode step; writes the cache.

    ``qkv``: the fused projection of the new token; ``k_cache``/``v_cache``: one layer's
    ``(rows, kv_heads, capacity, head_dim)`` cache; ``valid``: ``(rows, capacity)`` uint8;
    ``col``: a one-element long tensor on the device.
    """
    import torch
    import triton

    rows = qkv.shape[0]
    group = n_heads // kv_heads
    out = torch.empty((rows, n_heads * head_dim), dtype=qkv.dtype, device=qkv.device)
    if qkv.stride(-1) != 1 or cos.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("decode_attention: the last dimension must be contiguous")
    block_d = max(16, triton.next_power_of_2(head_dim))
    if valid.dtype == torch.bool:
        valid = valid.view(torch.uint8)
    _kernel()[(rows, kv_heads)](
        qkv,
        cos,
        sin,
        k_cache,
        v_cache,
        valid,
        col,
        out,
        qkv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        valid.stride(0),
        out.stride(0),
        H=n_heads,
        KV=kv_heads,
        D=head_dim,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        IEEE=qkv.dtype == torch.float32,
    )
    return out
