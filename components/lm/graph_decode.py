"""Large-batch decoding of Llama-family LMs (SmolLM2, Llama, Qwen2) over a static KV cache.

Why not ``model.generate``: at batch 256 a decode step of a 135M model must read its weights
once and the whole KV cache, so its floor is memory bandwidth. transformers' eager step
repeats the grouped-query keys and values per query head (3x the cache traffic for
SmolLM2) and launches ~1,000 small kernels a step, so the GPU mostly waits.

This path: one prefill per row chunk with the transformers model, its cache copied into a
static ``(batch, kv_heads, capacity, head_dim)`` buffer per layer; then each step runs our
own decode step: fused q/k/v and gate/up weights, attention as two batched matmuls per
kv head group (no repeat), the padding/causal mask from a per-row validity buffer, the new
key/value written in place at one shared column (prompts are left padded). The attended
length is rounded up to ``bucket`` columns; on CUDA the step for each length is captured
once as a CUDA graph and replayed, so a step costs one launch. ``compile=True`` also runs
the step through ``torch.compile`` (fewer, fused kernels) before capture. On CPU the same
step runs eagerly: the tests check it against transformers token for token.

``attention="triton"`` (the CUDA default where Triton imports) replaces the attention's
~8 kernels per layer (rotary, cache writes, matmuls, mask, softmax) by one kernel
(``components/lm/decode_attention.py``) that reads the current column on the device, so
a single CUDA graph serves every step and nothing is padded to a bucket. On an H200 at
batch 256 it makes a SmolLM2-135M step 1.6x (512 prompt tokens) to 1.3x (4,096) faster
(bench/results/gpu_decode.json). ``micro_batches=2`` decodes the two halves of the rows on
two CUDA streams in the one graph; it measured 7% slower there, so it is off by default.

LoRA (peft) models are decoded with the adapter's delta added to the fused weights (the
model is not modified); weights are re-copied into the same buffers at every call, so
captured graphs stay valid while a policy trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.lm.fused_weights import base_model, copy_fused, fused_buffers, supports

ATTENTION = ("torch", "triton")  # eager matmuls, or one Triton kernel per layer (CUDA)


@dataclass(frozen=True)
class DecodeTimings:
    """Where one ``generate`` call spent its time (seconds; CUDA-synchronised)."""

    prefill_s: float
    decode_s: float
    steps: int
    graphs_captured: int


class GraphDecoder:
    """Static-cache decoder for one model, ``batch_size`` rows and ``capacity`` positions.

    ``generate`` takes left-padded ``ids``/``mask`` of at most ``batch_size`` rows and
    returns the new tokens (rows x steps) and, on request, their log-probabilities.
    """

    def __init__(
        self,
        model: Any,
        batch_size: int,
        capacity: int,
        *,
        bucket: int = 128,
        graphs: bool | None = None,
        compile: bool = False,
        prefill_rows: int = 32,
        attention: str | None = None,
        micro_batches: int = 1,
    ) -> None:
        import torch

        from components.lm import decode_attention

        if not supports(model):
            raise ValueError(
                f"GraphDecoder: unsupported model type {model.config.model_type!r} "
                "(or biases outside q/k/v)"
            )
        self.model = model
        base = base_model(model)
        self.inner = base.model
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.batch_size, self.capacity, self.bucket = batch_size, capacity, bucket
        self.prefill_rows = prefill_rows
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        attn = self.inner.layers[0].self_attn
        self.scaling = getattr(attn, "scaling", self.head_dim**-0.5)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if attention is None:
            cuda = self.device.type == "cuda"
            attention = "triton" if cuda and decode_attention.available() else "torch"
        if attention not in ATTENTION:
            raise ValueError(f"GraphDecoder: attention is one of {ATTENTION}, not {attention!r}")
        self.attention = attention
        if micro_batches not in (1, 2) or batch_size % micro_batches:
            raise ValueError(
                f"GraphDecoder: micro_batches is 1 or 2 (even batch), not {micro_batches}"
            )
        self.micro_batches = micro_batches
        n_layers = len(self.inner.layers)
        shape = (n_layers, batch_size, self.kv_heads, capacity, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.valid = torch.zeros((batch_size, capacity), dtype=torch.bool, device=self.device)
        self.valid_u8 = self.valid.view(torch.uint8)  # the Triton kernel's view of it
        self.columns = torch.arange(capacity, device=self.device)
        self.tok = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.col = torch.zeros(1, dtype=torch.long, device=self.device)
        self.layers = [fused_buffers(layer, self.dtype, self.device) for layer in self.inner.layers]
        self.lm_head = base.lm_head.weight
        half = torch.ones(self.head_dim // 2, dtype=self.dtype, device=self.device)
        self.rotate_sign = torch.cat([-half, half])
        self._step_fn: Callable[[int], Any] = self._step
        # compile one layer (the same code for every layer: compiled once, fast to build)
        self._layer_fn: Callable[..., Any] = self._layer
        self._triton_fn: Callable[..., Any] = self._triton_attention
        if compile:
            self._layer_fn = torch.compile(self._layer, dynamic=True)
            # the Triton kernel stays opaque to dynamo: compiled code runs around it
            self._triton_fn = torch.compiler.disable(self._triton_attention)
        self._graphs: dict[int, tuple[Any, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        # micro-batches write their halves of one logits buffer; the second half's stream
        self._logits = None
        self._side = None
        if micro_batches > 1:
            vocab = self.lm_head.shape[0]
            self._logits = torch.empty((batch_size, vocab), dtype=self.dtype, device=self.device)
            self._side = torch.cuda.Stream() if self.graphs else None
        self.last_timings: DecodeTimings | None = None

    # -- weights --------------------------------------------------------------------------

    def refresh_weights(self) -> None:
        """Copy the model's current weights (LoRA deltas added) into the fused buffers."""
        for dst, layer in zip(self.layers, self.inner.layers, strict=True):
            copy_fused(dst, layer, self.scaling)

    # -- one decode step ------------------------------------------------------------------

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
        """One transformer layer for one new token per row; ``x``: (rows, hidden).

        ``mask``: the rows' masked columns (torch attention) or their ``valid`` bytes
        (Triton). Takes tensors only (no per-layer object), so a compiled layer serves
        every layer.
        """
        qkv_w, qkv_b, o_w, gate_up_w, down_w, ln1, ln2 = weights
        import torch
        import torch.nn.functional as F

        h = F.rms_norm(x, (x.shape[-1],), ln1, self.eps)
        qkv = F.linear(h, qkv_w, qkv_b)  # q rows pre-scaled (refresh_weights)
        if self.attention == "triton":
            out = self._triton_fn(qkv, cos, sin, k_cache, v_cache, mask)
        else:
            out = self._torch_attention(qkv, k_cache, v_cache, col, cos, sin, mask)
        x = torch.addmm(x, out, o_w.t())
        gate, up = F.linear(F.rms_norm(x, (x.shape[-1],), ln2, self.eps), gate_up_w).chunk(2, -1)
        return torch.addmm(x, F.silu(gate) * up, down_w.t())

    def _triton_attention(
        self, qkv: Any, cos: Any, sin: Any, k_cache: Any, v_cache: Any, valid: Any
    ) -> Any:
        """Rotary, cache write and attention in one Triton kernel (outside torch.compile)."""
        from components.lm.decode_attention import decode_attention

        return decode_attention(
            qkv,
            cos,
            sin,
            k_cache,
            v_cache,
            valid,
            self.col,
            n_heads=self.n_heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
        )

    def _torch_attention(
        self, qkv: Any, k_cache: Any, v_cache: Any, col: Any, cos: Any, sin: Any, masked: Any
    ) -> Any:
        """Rotary, cache write and grouped-query attention as eager torch ops."""
        import torch

        b, nh, kvh, d = qkv.shape[0], self.n_heads, self.kv_heads, self.head_dim
        qk = qkv[:, : (nh + kvh) * d].view(b, nh + kvh, d)
        # rotary on q and k at once: x cos + rotate_half(x) sin, rotate_half = roll x sign
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)
        k_cache.index_copy_(2, col, qk[:, nh:, None, :])
        v_cache.index_copy_(2, col, qkv[:, (nh + kvh) * d :].view(b, kvh, 1, d))
        length = masked.shape[-1]
        # query head j reads kv head j // group: (b, kvh, group, d) x (b, kvh, d, length),
        # each cached key and value read once (no per-query-head repeat)
        q = qk[:, :nh].reshape(b, kvh, nh // kvh, d)
        scores = torch.matmul(q, k_cache[:, :, :length].transpose(-1, -2))
        scores = scores.masked_fill(masked, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v_cache[:, :, :length]).reshape(b, nh * d)

    def _step(self, length: int) -> Any:
        """Logits (rows x vocab) for ``self.tok`` at ``self.pos``, writing column ``self.col``.

        Attends over the first ``length`` cache columns (those past ``col`` are masked).
        With ``micro_batches=2`` the two halves of the rows run as independent chains, on
        two CUDA streams when graphs are captured: one half's bandwidth-bound attention
        overlaps the other half's latency-bound small matmuls.
        """
        import torch

        if self.micro_batches == 1:
            return self._forward(slice(None), length, None)
        half = self.batch_size // 2
        first, second = slice(0, half), slice(half, self.batch_size)
        if self._side is None:  # sequential (CPU, or CUDA without graphs)
            self._forward(first, length, self._logits[first])
            self._forward(second, length, self._logits[second])
            return self._logits
        main = torch.cuda.current_stream()
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            self._forward(second, length, self._logits[second])
        self._forward(first, length, self._logits[first])
        main.wait_stream(self._side)
        return self._logits

    def _forward(self, rows: slice, length: int, out: Any) -> Any:
        """The step for ``rows`` alone; logits into ``out`` (or a new tensor if None)."""
        import torch
        import torch.nn.functional as F

        x = self.inner.embed_tokens(self.tok[rows])
        cos, sin = self.inner.rotary_emb(x[:, None, :], self.pos[rows, None])
        sin = sin * self.rotate_sign
        if self.attention == "triton":  # (rows, head_dim); the kernel masks by itself
            cos, sin = cos[:, 0].contiguous(), sin[:, 0].contiguous()
            mask = self.valid_u8[rows]
        else:
            keep = self.valid[rows, :length] & (self.columns[:length] <= self.col)
            mask = ~keep[:, None, None, :]
        for i, w in enumerate(self.layers):
            weights = (w.qkv, w.qkv_bias, w.o, w.gate_up, w.down, w.ln1, w.ln2)
            k, v = self.k_cache[i, rows], self.v_cache[i, rows]
            x = self._layer_fn(x, weights, k, v, self.col, cos, sin, mask)
        x = F.rms_norm(x, (x.shape[-1],), self.inner.norm.weight, self.eps)
        if out is None:
            return F.linear(x, self.lm_head)
        return torch.matmul(x, self.lm_head.t(), out=out)

    def _run_step(self, length: int) -> Any:
        """The step's logits: a replayed CUDA graph (captured on first use) or eager."""
        import torch

        if not self.graphs:
            return self._step_fn(length)
        entry = self._graphs.get(length)
        if entry is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: compiled kernels, cuBLAS workspaces
                for _ in range(2):
                    self._step_fn(length)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._step_fn(length)
            entry = self._graphs[length] = (graph, out)
        entry[0].replay()
        return entry[1]

    # -- prefill and the decode loop ------------------------------------------------------

    def _prefill(self, ids: Any, mask: Any) -> Any:
        """Last-position logits of the prompts; their keys/values land in the cache."""
        import torch
        from transformers import DynamicCache

        n, width = ids.shape
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = []
        for start in range(0, n, self.prefill_rows):
            rows = slice(start, min(n, start + self.prefill_rows))
            cache = DynamicCache(config=self.model.config)
            out = self.model(
                input_ids=ids[rows],
                attention_mask=mask[rows],
                position_ids=positions[rows],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits.append(out.logits[:, -1, :])
            for i, layer in enumerate(cache.layers):
                self.k_cache[i, rows, :, :width] = layer.keys
                self.v_cache[i, rows, :, :width] = layer.values
        self.valid.fill_(True)
        self.valid[:n, :width] = mask.bool()
        self.pos[:n] = positions[:, -1] + 1
        self.col.fill_(width)
        return torch.cat(logits)

    def generate(
        self,
        ids: Any,
        mask: Any,
        *,
        max_new_tokens: int,
        pick: Callable[[Any], tuple[Any, Any]],
        done: Callable[[Any], bool] | None = None,
        check_every: int = 32,
    ) -> tuple[Any, Any]:
        """New tokens (rows x steps) and their logprobs (or None) after left-padded prompts.

        ``pick(logits) -> (tokens, logprobs or None)`` chooses each step's tokens;
        ``done(tokens so far)`` (every ``check_every`` steps) ends the batch early.
        """
        import time

        import torch

        n, width = ids.shape
        if n > self.batch_size or width + max_new_tokens > self.capacity:
            raise ValueError(
                f"GraphDecoder holds {self.batch_size} rows x {self.capacity} positions; "
                f"asked for {n} x {width + max_new_tokens}"
            )
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        start = time.perf_counter()
        self.refresh_weights()
        logits = self._prefill(ids, mask)
        if n < self.batch_size:  # fixed-size graphs: spare rows decode from a copy of row 0
            pad = logits[:1].expand(self.batch_size - n, -1)
            logits = torch.cat([logits, pad])
            self.k_cache[:, n:] = self.k_cache[:, :1]
            self.v_cache[:, n:] = self.v_cache[:, :1]
            self.valid[n:] = self.valid[:1]
            self.pos[n:] = self.pos[:1]
        sync()
        prefill_s = time.perf_counter() - start
        tokens = torch.empty(
            (self.batch_size, max_new_tokens), dtype=torch.long, device=self.device
        )
        logps: Any = None
        captured = len(self._graphs)
        steps = 0
        for step in range(max_new_tokens):
            chosen, chosen_lp = pick(logits)
            tokens[:, step] = chosen
            if chosen_lp is not None:
                if logps is None:
                    logps = torch.empty(tokens.shape, dtype=torch.float32, device=self.device)
                logps[:, step] = chosen_lp
            steps = step + 1
            if step == max_new_tokens - 1:
                break
            if done is not None and steps % check_every == 0 and done(tokens[:n, :steps]):
                break
            self.tok.copy_(chosen)
            length = min(self.capacity, -(-(int(width) + step + 1) // self.bucket) * self.bucket)
            if self.attention == "triton":  # the kernel stops at `col`: one graph for all
                length = self.capacity
            logits = self._run_step(length)
            self.pos.add_(1)
            self.col.add_(1)
        sync()
        self.last_timings = DecodeTimings(
            prefill_s=prefill_s,
            decode_s=time.perf_counter() - start - prefill_s,
            steps=steps,
            graphs_captured=len(self._graphs) - captured,
        )
        lp = logps[:n, :steps] if logps is not None else None
        return tokens[:n, :steps], lp


def decoder_for(
    cache: dict[tuple[int, int], GraphDecoder],
    model: Any,
    batch_size: int,
    length: int,
    *,
    bucket: int = 128,
    **kwargs: Any,
) -> GraphDecoder:
    """A decoder of at least ``batch_size`` x ``length`` from ``cache`` (one is kept)."""
    capacity = -(-length // bucket) * bucket
    for (b, c), dec in cache.items():
        if b == batch_size and c >= capacity:
            return dec
    cache.clear()  # the old buffers (and graphs) go before the new ones are allocated
    dec = GraphDecoder(model, batch_size, capacity, bucket=bucket, **kwargs)
    cache[(batch_size, capacity)] = dec
    return dec
