"""Batched generation over a transformers causal LM: a fast path and a reference path.

Prompts are chat messages (rendered with the tokenizer's chat template and the generation
prompt) or raw strings. Every path sorts prompts by length (less padding per batch), left
pads them, decodes greedily (temperature 0) or samples (temperature, top-p), and ends a
sequence at eos, at the first stop string (``</reward>`` for the experience model) or
after ``max_new_tokens``; each answer is cut after its first stop string.

Four decoding paths, one result:

- ``fast`` (default off CUDA): our own decode loop over the KV cache. One prefill per
  batch that keeps only the last position's logits, then one token per step for the rows
  still running: a row that hits eos or a stop string leaves the batch (its KV rows are
  dropped), and the batch ends when every row is done. Stop strings are detected from
  each row's decoded tail (token pieces are decoded once and cached), confirmed by one
  full decode, so a stop costs nothing per step.
- ``graph`` (default on CUDA for Llama-family models): ``graph_decode.GraphDecoder``, our
  decode step over a static KV cache, replayed as one CUDA graph per attended length
  (grouped-query attention without repeated keys); finished rows stay in the batch and
  the batch ends when every row has hit eos or a stop string (checked every 32 steps).
- ``static`` (default on CUDA for other models): ``model.generate`` with a static KV cache and
  ``torch.compile`` (transformers compiles the decode step when the cache is static); prompt
  widths and the cache length are bucketed and the last batch is padded to the batch size,
  so shapes repeat and compiled graphs are reused across calls.
- ``reference`` (``fast=False``): plain ``model.generate``, one prompt at a time, with
  transformers' own stop-string criterion: the oracle the other paths are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from components.config.base import fields_of

# the backend-neutral types (completion.py) and the token-level decoding (decoding.py) live
# beside this module; callers keep importing their names from here
from components.lm.completion import (
    DEFAULT_STOP,
    Completion,
    CompletionBackend,
    FinishReason,
    GenerationBackend,
    Prompt,
    cut_at_stop,
    render_prompts,
)
from components.lm.decoding import (
    bucket,
    decode_loop,
    pick_tokens,
    score_tokens,
    torch_threads,
)

__all__ = [
    "CACHE_BUCKET",
    "DEFAULT_STOP",
    "SMALL_MODEL_PARAMS",
    "WIDTH_BUCKET",
    "Completion",
    "CompletionBackend",
    "DecodePath",
    "FinishReason",
    "GenerationBackend",
    "Generator",
    "Prompt",
    "bucket",
    "cut_at_stop",
    "generate",
    "render_prompts",
    "score_tokens",
    "torch_threads",
]

DecodePath = Literal["fast", "graph", "static", "reference"]

# On CPU a small model runs one thread: its matrices are too small to split, and under
# contention (the 2-core reference machine shared with other jobs) OpenMP threads that
# wait on each other made a decode step 7x slower and a prefill 50x slower (measured).
SMALL_MODEL_PARAMS = 50_000_000
WIDTH_BUCKET = 64  # static path: prompt widths rounded up to this (fewer compiled shapes)
CACHE_BUCKET = 256  # static path: KV-cache length rounded up to this


@dataclass(frozen=True)
class Decoding:
    """One ``complete_ids`` call's settings, as each decode path receives them."""

    max_new_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    batch_size: int
    rng: Any  # a torch.Generator (fast path, seeded) or None
    logprobs: bool


class Generator(CompletionBackend):
    """Batched generation with one model and tokenizer.

    ``fast=False`` selects the reference path. ``graph`` chooses the CUDA-graph path
    (default: on CUDA for Llama-family models; on CPU it runs eagerly, for tests).
    ``static_cache`` / ``compile`` choose the static-cache path (default: on CUDA only);
    ``compile`` without CUDA is for tests.
    ``threads`` sets torch's intra-op threads during generation: "auto" = 1 for a small
    model on CPU (``SMALL_MODEL_PARAMS``), else unchanged; None = unchanged.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        fast: bool = True,
        graph: bool | None = None,
        static_cache: bool | None = None,
        compile: bool | None = None,
        threads: int | Literal["auto"] | None = "auto",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.fast = fast
        cuda = self.device.type == "cuda"
        from components.lm.fused_weights import supports

        self.graph = (cuda and supports(model)) if graph is None else graph
        self._decoders: dict[tuple[int, int], Any] = {}  # graph path: buffers and graphs
        self.static_cache = cuda if static_cache is None else static_cache
        self.compile = (cuda and self.static_cache) if compile is None else compile
        if threads == "auto":
            small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS
            threads = 1 if small and not cuda else None
        self.threads: int | None = threads
        self._pieces: dict[int, str] = {}  # token id -> decoded text (stop detection)

    @property
    def device(self) -> Any:
        """The model's device."""
        return next(self.model.parameters()).device

    @property
    def path(self) -> DecodePath:
        """Which decoding path ``generate`` takes."""
        if not self.fast:
            return "reference"
        if self.graph:
            return "graph"
        return "static" if self.static_cache else "fast"

    def complete(self, prompts: Sequence[Prompt], **decoding: Any) -> list[Completion]:
        """Completions with token ids and (on request) logprobs; ``decoding``: see
        ``complete_ids``."""
        texts = render_prompts(self.tokenizer, prompts)
        encoded = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        return self.complete_ids(encoded, **decoding)

    def complete_ids(
        self,
        encoded: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = DEFAULT_STOP,
        batch_size: int = 8,
        seed: int | None = None,
        logprobs: bool = False,
    ) -> list[Completion]:
        """Completions of already tokenised prompts, in input order.

        Greedy at ``temperature`` 0, else sampled (nucleus ``top_p``; ``seed`` None draws
        from torch's global RNG). ``logprobs`` are free on the fast path; the other paths
        score the answers with one extra teacher-forced forward pass per batch
        (``score_tokens``).
        """
        import torch

        if not encoded:
            return []
        stop = tuple(stop)
        encoded = [list(e) for e in encoded]
        if self.path == "reference":
            batch_size = 1
        # longest first: similar lengths share a batch (less padding), OOM shows up at once
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        out: list[Completion | None] = [None] * len(encoded)
        rng = None
        if seed is not None:
            if self.path in ("fast", "graph"):  # a local generator: global RNG untouched
                rng = torch.Generator(device=self.device).manual_seed(seed)
            else:
                torch.manual_seed(seed)  # model.generate samples from the global RNG
        decode = {
            "fast": self._fast_batch,
            "graph": self._graph_batch,
            "static": self._static_batch,
        }.get(self.path, self._reference_batch)
        d = Decoding(max_new_tokens, temperature, top_p, stop, batch_size, rng, logprobs)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch_threads(self.threads), torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    idx = order[start : start + batch_size]
                    batch = decode([encoded[i] for i in idx], d)
                    for i, c in zip(idx, batch, strict=True):
                        out[i] = c
        finally:
            self.model.train(was_training)
        return [c for c in out if c is not None]

    # -- shared helpers ------------------------------------------------------------------

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for eos in (self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id):
            if isinstance(eos, int):
                ids.add(eos)
            elif eos is not None:
                ids.update(int(e) for e in eos)
        return ids

    def _left_pad(self, encoded: list[list[int]], width: int) -> tuple[Any, Any]:
        import torch

        pad = self._pad_id()
        ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, width - len(e) :] = torch.tensor(e, dtype=torch.long)
            mask[row, width - len(e) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _finish(
        self, tokens: list[int], logps: list[float], reason: FinishReason, stop: Sequence[str]
    ) -> Completion:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(cut_at_stop(text, stop), tuple(tokens), tuple(logps), reason, len(tokens))

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self.tokenizer.decode([token], skip_special_tokens=True)
            self._pieces[token] = piece
        return piece

    # -- fast path: our own decode loop over a dynamic KV cache ---------------------------

    def _fast_batch(self, encoded: list[list[int]], d: Decoding) -> list[Completion]:
        ids, mask = self._left_pad(encoded, max(len(e) for e in encoded))
        keep_chars = max((len(s) for s in d.stop), default=0) * 2 + 8
        rows = decode_loop(
            self.model,
            ids,
            mask,
            **fields_of(d, "max_new_tokens", "temperature", "top_p", "rng", "logprobs"),
            eos=self._eos_ids(),
            stopped=lambda tail, tokens: self._stopped(tail, tokens, d.stop, keep_chars),
        )
        return [self._finish(t, lp, reason, d.stop) for t, lp, reason in rows]

    def _stopped(
        self, tail: str, tokens: list[int], stop: Sequence[str], keep_chars: int
    ) -> tuple[bool, str]:
        """Whether ``tokens`` (just grown by one) contain a stop string; the new tail."""
        if not stop:
            return False, tail
        tail = (tail + self._piece(tokens[-1]))[-keep_chars:]
        if not any(s in tail for s in stop):
            return False, tail
        # pieces decoded one by one can differ from the real decode (merged spaces...):
        # confirm on the full text, and forget a false alarm
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return (True, tail) if any(s in text for s in stop) else (False, "")

    # -- graph path: our decode step over a static cache, replayed as CUDA graphs ---------

    def _graph_batch(self, encoded: list[list[int]], d: Decoding) -> list[Completion]:
        from components.lm.graph_decode import decoder_for

        ids, mask = self._left_pad(encoded, max(len(e) for e in encoded))
        # compiled layers around the Triton attention on CUDA: 2-7% faster steps than eager
        # (bench/results/gpu_decode.json)
        cuda = self.device.type == "cuda"
        dec = decoder_for(
            self._decoders, self.model, d.batch_size, ids.shape[1] + d.max_new_tokens, compile=cuda
        )
        eos = self._eos_ids()

        def done(tokens: Any) -> bool:
            for row in tokens.tolist():
                if not eos.intersection(row):
                    text = self.tokenizer.decode(row, skip_special_tokens=True)
                    if not any(s in text for s in d.stop):
                        return False
            return True

        new, logps = dec.generate(
            ids,
            mask,
            max_new_tokens=d.max_new_tokens,
            pick=lambda logits: pick_tokens(logits, d.temperature, d.top_p, d.rng, d.logprobs),
            done=done,
        )
        return self._split(new, ids, mask, d, logps)

    # -- static path: model.generate with a static KV cache (+ torch.compile) -------------

    def _static_batch(self, encoded: list[list[int]], d: Decoding) -> list[Completion]:
        from transformers import CompileConfig

        n = len(encoded)
        rows = list(encoded)
        if self.compile:  # fixed batch shape: the compiled graphs are reused
            rows += [encoded[-1]] * (d.batch_size - n)
        width = bucket(max(len(e) for e in rows), WIDTH_BUCKET)
        ids, mask = self._left_pad(rows, width)
        compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        if self.device.type != "cuda":
            compile_config._compile_all_devices = True  # tests exercise the path on CPU
        kwargs = self._kwargs(d)
        kwargs.update(
            cache_implementation="static",
            max_cache_len=bucket(width + d.max_new_tokens, CACHE_BUCKET),
            compile_config=compile_config if self.compile else None,
            disable_compile=not self.compile,
        )
        generated = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return self._split(generated[:n, width:], ids[:n], mask[:n], d)

    # -- reference path: plain model.generate, one prompt at a time ----------------------

    def _reference_batch(self, encoded: list[list[int]], d: Decoding) -> list[Completion]:
        ids, mask = self._left_pad(encoded, max(len(e) for e in encoded))
        generated = self.model.generate(input_ids=ids, attention_mask=mask, **self._kwargs(d))
        width = ids.shape[1]
        return self._split(generated[:, width:], ids, mask, d)

    def _kwargs(self, d: Decoding) -> dict[str, Any]:
        """``model.generate`` arguments of these decoding settings."""
        kwargs: dict[str, Any] = {
            "max_new_tokens": d.max_new_tokens,
            "pad_token_id": self._pad_id(),
            "eos_token_id": sorted(self._eos_ids()),
        }
        if d.temperature > 0:
            kwargs.update(do_sample=True, temperature=d.temperature, top_p=d.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if d.stop:
            kwargs.update(stop_strings=list(d.stop), tokenizer=self.tokenizer)
        return kwargs

    def _split(
        self, new: Any, prompt_ids: Any, prompt_mask: Any, d: Decoding, logps: Any = None
    ) -> list[Completion]:
        """Completions from generated rows (anything after eos / a stop string dropped);
        ``logps``: the rows' token logprobs where the decode loop kept them."""
        stop = d.stop
        eos = self._eos_ids()
        keep_chars = max((len(s) for s in stop), default=0) * 2 + 8
        rows: list[tuple[list[int], FinishReason]] = []
        for seq in new.tolist():
            tokens: list[int] = []
            tail = ""
            reason: FinishReason = "length"
            for t in seq:
                tokens.append(t)
                if t in eos:
                    reason = "eos"
                    break
                hit, tail = self._stopped(tail, tokens, stop, keep_chars)
                if hit:
                    reason = "stop"
                    break
            rows.append((tokens, reason))
        scores: list[list[float]] = [[] for _ in rows]
        if d.logprobs and logps is not None:
            scores = [lp[: len(t)] for lp, (t, _) in zip(logps.tolist(), rows, strict=True)]
        elif d.logprobs:
            scores = score_tokens(
                self.model, prompt_ids, prompt_mask, [r[0] for r in rows], d.temperature
            )
        return [self._finish(t, s, r, stop) for (t, r), s in zip(rows, scores, strict=True)]


def generate(model: Any, tokenizer: Any, prompts: Sequence[Prompt], **kwargs: Any) -> list[str]:
    """Convenience wrapper: ``Generator(model, tokenizer).generate(prompts, **kwargs)``."""
    return Generator(model, tokenizer).generate(prompts, **kwargs)
