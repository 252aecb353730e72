"""Experimental decode step: five Triton kernels per layer (norms and residuals fused in).

Status: a candidate, measured by ``bench.gpu_decode`` (label ``graph_fused``) beside the
default ``GraphDecoder``; it moves into ``components/lm`` only once a GPU run shows it
faster. Kept here until then because every agent stage of the pipeline depends on
``components/lm`` (dvc.yaml): changing it re-runs every environment's Table 1.

Why: at batch 256 and 512 prompt tokens an H200 decode step of SmolLM2-135M spends
~1.1 ms of its ~2.1 ms before reading any KV byte (bench/results/gpu_decode.json): 30
layers x ~8 kernels, most of them small GEMMs whose 128-wide tiles leave most SMs idle at
256 rows, plus the RMSNorm, SiLU-gate and residual kernels between them. Here a layer is

1. ``qkv = rms_norm(x) @ Wqkv^T``: the norm's gain is folded into the weight's columns and
   the row's ``1/rms`` is computed inside the GEMM's K loop (the GEMM reads the whole row
   anyway), applied to the accumulator;
2. the attention kernel of ``components.lm.decode_attention`` (unchanged);
3. ``x = x + attn @ Wo^T``: the residual add in the GEMM's epilogue;
4. ``h = silu(g) * u`` with ``[g, u] = rms_norm(x) @ Wgate_up^T``: one program computes a
   gate tile and the matching up tile, so the SiLU product is its epilogue;
5. ``x = x + h @ Wdown^T``.

``f32_residual=True`` keeps the residual stream ``x`` in float32 and replaces 3 and 5 by
one kernel that adds ``a @ W^T`` into ``x`` in place, its K range split over up to 4
programs (atomic adds) when the autotuner finds that faster: the 1,536-deep down
projection has only ~72 output tiles at 256 rows.

A step also gathers its rows' rotary terms from a table made once (one kernel, where the
model's rotary module takes about ten).

The GEMM tiles (16-64 rows, 32-128 columns) are autotuned per shape, so the small
projections spread over the SMs; ``autotuned()`` lists the picks. Rounding differs from
the eager path (the normalised hidden state is never rounded to the model dtype; the gain
is rounded into the weight); in float32 and float16 the greedy tokens equal the plain
decoder's (tests/lm/test_fused_decode.py, CUDA or the Triton CPU interpreter).
"""

from __future__ import annotations

import os
from typing import Any

from components.lm.graph_decode import GraphDecoder

_KERNEL: Any = None
_ADD_KERNEL: Any = None


def _fit_rows(configs: list[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
    """Tiles no taller than the rows (rounded up to 16): a few-row call times fewer tiles."""
    cap = max(16, 1 << (int(named_args["M"]) - 1).bit_length())
    return [c for c in configs if c.kwargs["BLOCK_M"] <= cap] or configs[:1]


def _kernel() -> Any:
    """The fused linear kernel, defined on first use (Triton imported only here)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    # 12 tiles, each compiled and timed once per GEMM shape (4 per model) on first use;
    # 128-deep K steps only where they may pay (the 1,536-deep down projection)
    tiles = [(m, n, 64) for m in (16, 32, 64) for n in (32, 64, 128)]
    tiles += [(16, 64, 128), (32, 64, 128), (64, 64, 128)]
    configs = [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k},
            num_warps=2 if m * n <= 1024 else 4,
            num_stages=3,
        )
        for m, n, k in tiles
    ]
    if os.environ.get("TRITON_INTERPRET") == "1":  # the CPU interpreter cannot time configs
        configs = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}, num_warps=4)]

    @triton.autotune(
        configs=configs,
        key=["M", "N", "K", "NORM", "GLU", "RESIDUAL", "PRECISION"],
        prune_configs_by={"early_config_prune": _fit_rows},
    )
    @triton.jit
    def fused_linear_kernel(
        a_ptr,  # (M, K) input rows
        w_ptr,  # (N, K), or (2N, K) for GLU: gate rows then up rows (Linear layout)
        bias_ptr,  # (N,) or a dummy
        res_ptr,  # (M, N) residual, or a dummy
        out_ptr,  # (M, N)
        M,
        N,
        K,
        eps,
        stride_am,
        stride_wn,
        stride_rm,
        stride_om,
        NORM: tl.constexpr,  # scale each row by 1 / rms(a row) (gain folded into w)
        GLU: tl.constexpr,  # out = silu(a @ w_gate^T) * (a @ w_up^T)
        HAS_BIAS: tl.constexpr,
        RESIDUAL: tl.constexpr,  # out = res + a @ w^T
        PDL: tl.constexpr,  # launched as a programmatic dependent launch (Hopper+)
        PRECISION: tl.constexpr,  # "ieee" for exact float32 dots (tf32 would round them)
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        if PDL:
            # let the next kernel's blocks get resident now; wait for the previous kernel's
            # writes before reading anything it produced (every input but the weights)
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        m_ok = offs_m < M
        n_ok = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < K
            a = tl.load(
                a_ptr + offs_m[:, None] * stride_am + ks[None, :],
                mask=m_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            if NORM:
                a32 = a.to(tl.float32)
                sum_sq += tl.sum(a32 * a32, axis=1)
            w_ok = k_ok[:, None] & n_ok[None, :]
            w = tl.load(w_ptr + offs_n[None, :] * stride_wn + ks[:, None], mask=w_ok, other=0.0)
            a = a.to(w.dtype)  # a float32 residual stream meets model-dtype weights
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
            if GLU:
                up_rows = offs_n[None, :] + N
                wu = tl.load(w_ptr + up_rows * stride_wn + ks[:, None], mask=w_ok, other=0.0)
                acc_up = tl.dot(a, wu, acc_up, input_precision=PRECISION)
        if NORM:
            inv_rms = 1.0 / tl.sqrt(sum_sq / K + eps)
            acc = acc * inv_rms[:, None]
            if GLU:
                acc_up = acc_up * inv_rms[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GLU:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up
        out_ok = m_ok[:, None] & n_ok[None, :]
        if RESIDUAL:
            res = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=out_ok)
            acc += res.to(tl.float32)
        dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=out_ok)

    _KERNEL = fused_linear_kernel
    return _KERNEL


def autotuned() -> dict[str, str]:
    """The tile chosen per autotune key so far (for the benchmark's record)."""
    kernels = (k for k in (_KERNEL, _ADD_KERNEL) if k is not None)
    return {str(key): str(config) for k in kernels for key, config in k.cache.items()}


def fused_linear(
    a: Any,
    weight: Any,
    *,
    bias: Any = None,
    residual: Any = None,
    norm_eps: float | None = None,
    glu: bool = False,
    pdl: bool = False,
) -> Any:
    """``[res +] f(a) @ weight^T [+ bias]`` in one kernel; ``f`` = 1/rms per row if ``norm_eps``.

    ``glu=True``: ``weight`` holds gate then up rows and the result is
    ``silu(gate) * up`` (half as wide as ``weight`` is tall). ``pdl=True``: launched as a
    programmatic dependent launch, so it is resident before the previous kernel ends
    (CUDA, compute capability 9+).
    """
    import torch
    import triton

    if a.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("fused_linear: the last dimension must be contiguous")
    m, k = a.shape
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    out = torch.empty((m, n), dtype=weight.dtype, device=a.device)
    dummy = out
    _kernel()[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))](
        a,
        weight,
        bias if bias is not None else dummy,
        residual if residual is not None else dummy,
        out,
        m,
        n,
        k,
        norm_eps if norm_eps is not None else 0.0,
        a.stride(0),
        weight.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        NORM=norm_eps is not None,
        GLU=glu,
        HAS_BIAS=bias is not None,
        RESIDUAL=residual is not None,
        PDL=pdl,
        PRECISION="ieee" if weight.dtype == torch.float32 else "tf32",
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


def _add_kernel() -> Any:
    """The in-place ``x += a @ w^T`` kernel (split-K by atomic adds), defined on first use."""
    global _ADD_KERNEL
    if _ADD_KERNEL is not None:
        return _ADD_KERNEL
    import triton
    import triton.language as tl

    configs = [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64, "SPLIT_K": split},
            num_warps=2 if m * n <= 1024 else 4,
            num_stages=3,
        )
        for m in (16, 32, 64)
        for n in (32, 64)
        for split in (1, 2, 4)
    ]
    if os.environ.get("TRITON_INTERPRET") == "1":  # one config, the atomic (split) path
        configs = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 2})]

    # autotuning runs the kernel many times: x is restored after each config's timing
    keys = ["M", "N", "K", "PDL", "PRECISION"]

    @triton.autotune(
        configs=configs,
        key=keys,
        restore_value=["x_ptr"],
        prune_configs_by={"early_config_prune": _fit_rows},
    )
    @triton.jit
    def add_linear_kernel(
        a_ptr,  # (M, K) model dtype
        w_ptr,  # (N, K) model dtype
        x_ptr,  # (M, N) float32, updated in place
        M,
        N,
        K,
        stride_am,
        stride_wn,
        stride_xm,
        PDL: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr,  # programs along K, each adding its partial product
    ):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        m_ok = offs_m < M
        n_ok = offs_n < N
        span = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K  # each split's K range
        k_lo = tl.program_id(2) * span
        k_hi = tl.minimum(k_lo + span, K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < k_hi
            a = tl.load(
                a_ptr + offs_m[:, None] * stride_am + ks[None, :],
                mask=m_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            w_ok = k_ok[:, None] & n_ok[None, :]
            w = tl.load(w_ptr + offs_n[None, :] * stride_wn + ks[:, None], mask=w_ok, other=0.0)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
        dst = x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :]
        ok = m_ok[:, None] & n_ok[None, :]
        if SPLIT_K == 1:  # one writer per element: a plain (deterministic) add
            tl.store(dst, tl.load(dst, mask=ok) + acc, mask=ok)
        else:
            tl.atomic_add(dst, acc, mask=ok)

    _ADD_KERNEL = add_linear_kernel
    return _ADD_KERNEL


def add_linear_(x: Any, a: Any, weight: Any, *, pdl: bool = False) -> Any:
    """``x += a @ weight^T`` in place on a float32 ``x``; K may be split over programs."""
    import torch
    import triton

    if x.dtype != torch.float32 or a.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("add_linear_: float32 x; a and weight contiguous in the last dim")
    m, k = a.shape
    n = weight.shape[0]
    _add_kernel()[
        lambda meta: (
            triton.cdiv(m, meta["BLOCK_M"]),
            triton.cdiv(n, meta["BLOCK_N"]),
            meta["SPLIT_K"],
        )
    ](
        a,
        weight,
        x,
        m,
        n,
        k,
        a.stride(0),
        weight.stride(0),
        x.stride(0),
        PDL=pdl,
        PRECISION="ieee" if weight.dtype == torch.float32 else "tf32",
        **({"launch_pdl": True} if pdl else {}),
    )
    return x


class FusedGraphDecoder(GraphDecoder):
    """``GraphDecoder`` whose layer is five Triton kernels (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        batch_size: int,
        capacity: int,
        *,
        pdl: bool = False,
        f32_residual: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("compile") or kwargs.pop("attention", "triton") != "triton":
            raise ValueError("FusedGraphDecoder: Triton attention, no torch.compile")
        import torch

        super().__init__(model, batch_size, capacity, attention="triton", **kwargs)
        self.pdl = pdl  # the GEMMs as programmatic dependent launches
        # the residual stream in float32, the o / down GEMMs adding into it in place
        # (split-K by atomic adds: the sum's order, and so its last bits, may vary by run)
        self.f32_residual = f32_residual
        # rotary cos / sign-folded sin of every position, (capacity, 2, head_dim): a step
        # gathers its rows' in one kernel instead of recomputing them (~10 small kernels)
        probe = torch.zeros((1, 1, model.config.hidden_size), dtype=self.dtype, device=self.device)
        cos, sin = self.inner.rotary_emb(probe, self.columns[None])
        self.rotary = torch.stack([cos[0], sin[0] * self.rotate_sign], dim=1).contiguous()

    def refresh_weights(self) -> None:
        """The fused buffers, with each RMSNorm's gain folded into the next GEMM's columns."""
        import torch

        super().refresh_weights()
        with torch.no_grad():
            for w in self.layers:
                w.qkv.mul_(w.ln1)
                w.gate_up.mul_(w.ln2)

    def _forward(self, rows: slice, length: int, out: Any) -> Any:
        """The base step with the rotary terms gathered from the table."""
        import torch
        import torch.nn.functional as F

        x = self.inner.embed_tokens(self.tok[rows])
        if self.f32_residual:
            x = x.float()
        rotary = self.rotary.index_select(0, self.pos[rows])
        cos, sin = rotary[:, 0], rotary[:, 1]  # same row stride, as the kernel expects
        mask = self.valid_u8[rows]
        for i, w in enumerate(self.layers):
            weights = (w.qkv, w.qkv_bias, w.o, w.gate_up, w.down, w.ln1, w.ln2)
            k, v = self.k_cache[i, rows], self.v_cache[i, rows]
            x = self._layer(x, weights, k, v, self.col, cos, sin, mask)
        x = F.rms_norm(x.to(self.dtype), (x.shape[-1],), self.inner.norm.weight, self.eps)
        if out is None:
            return F.linear(x, self.lm_head)
        return torch.matmul(x, self.lm_head.t(), out=out)

    def _layer(
        self,
        x: Any,
        weights: tuple[Any, ...],
        k_cache: Any,
        v_cache: Any,
        col: Any,
        cos: Any,
        sin: Any,
        mask: Any,
    ) -> Any:
        """One layer as norm+qkv, attention, o+residual, norm+gate/up+SiLU, down+residual."""
        qkv_w, qkv_b, o_w, gate_up_w, down_w, _, _ = weights
        pdl = self.pdl
        qkv = fused_linear(x, qkv_w, bias=qkv_b, norm_eps=self.eps, pdl=pdl)
        out = self._triton_attention(qkv, cos, sin, k_cache, v_cache, mask)
        if self.f32_residual:
            add_linear_(x, out, o_w, pdl=pdl)
        else:
            x = fused_linear(out, o_w, residual=x, pdl=pdl)
        h = fused_linear(x, gate_up_w, norm_eps=self.eps, glu=True, pdl=pdl)
        if self.f32_residual:
            return add_linear_(x, h, down_w, pdl=pdl)
        return fused_linear(h, down_w, residual=x, pdl=pdl)
