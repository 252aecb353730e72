"""Batched generation over a transformers causal LM: a fast path and a reference path.

Prompts are chat messages (rendered with the tokenizer's chat template and the generation
prompt) or raw strings. Every path sorts prompts by length (less padding per batch), left
pads them, decodes greedily (temperature 0) or samples (temperature, top-p), and ends a
sequence at eos, at the first stop string (``</reward>`` for the experience model) or
after ``max_new_tokens``; each answer is cut after its first stop string.

Three decoding paths, one result:

- ``fast`` (default off CUDA): our own decode loop over the KV cache. One prefill per
  batch that keeps only the last position's logits, then one token per step for the rows
  still running: a row that hits eos or a stop string leaves the batch (its KV rows are
  dropped), and the batch ends when every row is done. Stop strings are detected from
  each row's decoded tail (token pieces are decoded once and cached), confirmed by one
  full decode, so a stop costs nothing per step.
- ``static`` (default on CUDA): ``model.generate`` with a static KV cache and
  ``torch.compile`` (transformers compiles the decode step when the cache is static); prompt
  widths and the cache length are bucketed and the last batch is padded to the batch size,
  so shapes repeat and compiled graphs are reused across calls.
- ``reference`` (``fast=False``): plain ``model.generate``, one prompt at a time, with
  transformers' own stop-string criterion: the oracle the other paths are tested against.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Prompt = list[dict[str, str]] | str
FinishReason = Literal["stop", "eos", "length", "error"]
DecodePath = Literal["fast", "static", "reference"]

DEFAULT_STOP = ("</reward>",)
# On CPU a small model runs one thread: its matrices are too small to split, and under
# contention (the 2-core reference machine shared with other jobs) OpenMP threads that
# wait on each other made a decode step 7x slower and a prefill 50x slower (measured).
SMALL_MODEL_PARAMS = 50_000_000
WIDTH_BUCKET = 64  # static path: prompt widths rounded up to this (fewer compiled shapes)
CACHE_BUCKET = 256  # static path: KV-cache length rounded up to this


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything that turns prompts into completions (local model, OpenAI-compatible server)."""

    def generate(self, prompts: Sequence[Prompt], **kwargs: Any) -> list[str]:
        """Completions for ``prompts`` in input order."""
        ...


@dataclass(frozen=True)
class Completion:
    """One answer with the tokens that produced it.

    ``token_ids`` run through the token that completed the stop string (or eos, or the
    last of ``max_new_tokens``); ``logprobs`` are their log-probabilities under the
    sampling distribution before top-p (logits / temperature; temperature 0 counts as 1).
    Backends that cannot see tokens (a remote server) leave both empty and report the
    server's token count in ``n_tokens``. ``finish_reason`` "error": a remote request
    that failed for good (only when the backend is told not to raise).
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    n_tokens: int  # generated tokens (through the stop/eos token)


def render_prompts(tokenizer: Any, prompts: Sequence[Prompt]) -> list[str]:
    """Chat prompts rendered with the generation prompt; strings are kept as they are."""
    return [
        p
        if isinstance(p, str)
        else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """The text up to and including the earliest stop string (unchanged if none occurs)."""
    ends = [text.index(s) + len(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text


def bucket(n: int, size: int) -> int:
    """``n`` rounded up to a multiple of ``size``."""
    return max(size, math.ceil(n / size) * size)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads (None: unchanged), then restore."""
    import torch

    if n is None or n == torch.get_num_threads():
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class CompletionBackend:
    """What every backend shares: ``generate`` is the texts of its ``complete``."""

    def complete(self, prompts: Sequence[Prompt], **decoding: Any) -> list[Completion]:
        """Completions (text, tokens when known, finish reason) for ``prompts`` in order."""
        raise NotImplementedError

    def generate(self, prompts: Sequence[Prompt], **decoding: Any) -> list[str]:
        """Completions for ``prompts`` in input order, each cut after the first stop string.

        ``decoding``: max_new_tokens, temperature, top_p, stop, batch_size, seed.
        """
        return [c.text for c in self.complete(prompts, **decoding)]


class Generator(CompletionBackend):
    """Batched generation with one model and tokenizer.

    ``fast=False`` selects the reference path. ``static_cache`` / ``compile`` choose the
    static-cache path (default: on CUDA only); ``compile`` without CUDA is for tests.
    ``threads`` sets torch's intra-op threads during generation: "auto" = 1 for a small
    model on CPU (``SMALL_MODEL_PARAMS``), else unchanged; None = unchanged.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        fast: bool = True,
        static_cache: bool | None = None,
        compile: bool | None = None,
        threads: int | Literal["auto"] | None = "auto",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.fast = fast
        cuda = self.device.type == "cuda"
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
            if self.path == "fast":  # a local generator: no global RNG state is touched
                rng = torch.Generator(device=self.device).manual_seed(seed)
            else:
                torch.manual_seed(seed)  # model.generate samples from the global RNG
        decode = {"fast": self._fast_batch, "static": self._static_batch}.get(
            self.path, self._reference_batch
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch_threads(self.threads), torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    idx = order[start : start + batch_size]
                    batch = decode(
                        [encoded[i] for i in idx],
                        max_new_tokens=max_new_tokens,
                        temperature=temperature,
                        top_p=top_p,
                        stop=stop,
                        batch_size=batch_size,
                        rng=rng,
                        logprobs=logprobs,
                    )
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

    def _fast_batch(
        self,
        encoded: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
        rng: Any,
        logprobs: bool,
        **_: Any,
    ) -> list[Completion]:
        import torch

        model = self.model
        ids, mask = self._left_pad(encoded, max(len(e) for e in encoded))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _preallocated_cache(model.config, ids.shape[1] + max_new_tokens)
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # prefill: only the last position's logits are needed
        ).logits[:, -1, :]
        next_pos = positions[:, -1:] + 1
        # Decode-step mask: building it from the 2D mask each step costs as much as the
        # attention itself on CPU; with SDPA, pass a ready 4D view of one boolean buffer
        # (None when no row is padded).
        sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        attend = torch.ones((len(encoded), ids.shape[1] + max_new_tokens), dtype=torch.bool)
        attend = attend.to(mask.device)
        attend[:, : ids.shape[1]] = mask.bool()
        eos = self._eos_ids()
        keep_chars = max((len(s) for s in stop), default=0) * 2 + 8
        n = len(encoded)
        alive = list(range(n))  # original row of each row still in the batch
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        tails = [""] * n
        reasons: list[FinishReason] = ["length"] * n
        for step in range(max_new_tokens):
            chosen, chosen_lp = _pick(logits, temperature, top_p, rng, logprobs)
            chosen_list = chosen.tolist()
            lp_list = chosen_lp.tolist() if chosen_lp is not None else None
            keep: list[int] = []
            for j, (row, t) in enumerate(zip(alive, chosen_list, strict=True)):
                tokens[row].append(t)
                if lp_list is not None:
                    logps[row].append(lp_list[j])
                if t in eos:
                    reasons[row] = "eos"
                    continue
                hit, tails[row] = self._stopped(tails[row], tokens[row], stop, keep_chars)
                if hit:
                    reasons[row] = "stop"
                else:
                    keep.append(j)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) < len(alive):  # finished rows leave the batch and the KV cache
                sel = torch.tensor(keep, device=attend.device)
                cache.batch_select_indices(sel)
                attend, next_pos, chosen = attend[sel], next_pos[sel], chosen[sel]
                alive = [alive[j] for j in keep]
            kv_len = ids.shape[1] + step + 1
            if not sdpa:
                step_mask = attend[:, :kv_len].long()
            elif bool(attend[:, : ids.shape[1]].all()):
                step_mask = None
            else:
                step_mask = attend[:, None, None, :kv_len]
            logits = model(
                input_ids=chosen[:, None],
                attention_mask=step_mask,
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]
            next_pos = next_pos + 1
        return [self._finish(tokens[r], logps[r], reasons[r], stop) for r in range(n)]

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

    # -- static path: model.generate with a static KV cache (+ torch.compile) -------------

    def _static_batch(
        self,
        encoded: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
        batch_size: int,
        logprobs: bool,
        **_: Any,
    ) -> list[Completion]:
        from transformers import CompileConfig

        n = len(encoded)
        rows = list(encoded)
        if self.compile:  # fixed batch shape: the compiled graphs are reused
            rows += [encoded[-1]] * (batch_size - n)
        width = bucket(max(len(e) for e in rows), WIDTH_BUCKET)
        ids, mask = self._left_pad(rows, width)
        compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        if self.device.type != "cuda":
            compile_config._compile_all_devices = True  # tests exercise the path on CPU
        kwargs = self._generate_kwargs(max_new_tokens, temperature, top_p, stop)
        kwargs.update(
            cache_implementation="static",
            max_cache_len=bucket(width + max_new_tokens, CACHE_BUCKET),
            compile_config=compile_config if self.compile else None,
            disable_compile=not self.compile,
        )
        generated = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return self._split(generated[:n, width:], ids[:n], mask[:n], temperature, stop, logprobs)

    # -- reference path: plain model.generate, one prompt at a time ----------------------

    def _reference_batch(
        self,
        encoded: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
        logprobs: bool,
        **_: Any,
    ) -> list[Completion]:
        ids, mask = self._left_pad(encoded, max(len(e) for e in encoded))
        kwargs = self._generate_kwargs(max_new_tokens, temperature, top_p, stop)
        generated = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        width = ids.shape[1]
        return self._split(generated[:, width:], ids, mask, temperature, stop, logprobs)

    def _generate_kwargs(
        self, max_new_tokens: int, temperature: float, top_p: float, stop: Sequence[str]
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "pad_token_id": self._pad_id(),
            "eos_token_id": sorted(self._eos_ids()),
        }
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        return kwargs

    def _split(
        self,
        new: Any,
        prompt_ids: Any,
        prompt_mask: Any,
        temperature: float,
        stop: Sequence[str],
        logprobs: bool,
    ) -> list[Completion]:
        """Completions from ``model.generate``'s new tokens (padding after the end dropped)."""
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
        if logprobs:
            scores = score_tokens(
                self.model, prompt_ids, prompt_mask, [r[0] for r in rows], temperature
            )
        return [self._finish(t, s, r, stop) for (t, r), s in zip(rows, scores, strict=True)]


def _preallocated_cache(config: Any, capacity: int) -> Any:
    """A DynamicCache whose full-attention layers write into preallocated buffers.

    transformers' DynamicLayer grows by ``torch.cat`` at every step, copying the whole
    KV cache each time (a third of CPU decode time at ~1k tokens of context); these
    layers write the new step in place and hand attention a view of the filled part.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            super().lazy_initialization(key_states, value_states)
            b, h, _, dk = key_states.shape
            self._k = key_states.new_empty((b, h, capacity, dk))
            self._v = value_states.new_empty((b, h, capacity, value_states.shape[-1]))
            self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, q = self.keys.shape[-2], key_states.shape[-2]
            if n + q > self._k.shape[-2]:  # past the planned length: grow by doubling
                self._k = torch.cat([self._k, torch.empty_like(self._k)], dim=-2)
                self._v = torch.cat([self._v, torch.empty_like(self._v)], dim=-2)
            self._k[:, :, n : n + q] = key_states
            self._v[:, :, n : n + q] = value_states
            self.keys, self.values = self._k[:, :, : n + q], self._v[:, :, : n + q]
            return self.keys, self.values

        def batch_select_indices(self, indices: Any) -> None:
            if self.is_initialized:
                n = self.keys.shape[-2]
                self._k, self._v = self._k[indices], self._v[indices]
                self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    cache = DynamicCache(config=config)
    # sliding-window / other layer kinds keep their own implementation
    cache.layers = [
        GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def _pick(
    logits: Any, temperature: float, top_p: float, rng: Any, with_logprobs: bool
) -> tuple[Any, Any]:
    """Next tokens (greedy or sampled) and their log-probabilities (or None)."""
    import torch

    logits = logits.float()
    scaled = logits / temperature if temperature > 0 else logits
    logp = torch.log_softmax(scaled, dim=-1) if with_logprobs else None
    if temperature <= 0:
        chosen = torch.argmax(logits, dim=-1)
    else:
        probs = torch.softmax(_top_p(scaled, top_p), dim=-1)
        chosen = torch.multinomial(probs, 1, generator=rng).squeeze(1)
    chosen_lp = logp.gather(1, chosen[:, None]).squeeze(1) if logp is not None else None
    return chosen, chosen_lp


def _top_p(scores: Any, top_p: float) -> Any:
    """Nucleus filtering as transformers' TopPLogitsWarper (keeps at least one token)."""
    import torch

    if top_p >= 1.0:
        return scores
    sorted_scores, sorted_idx = torch.sort(scores, descending=False)
    cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, -float("inf"))


def score_tokens(
    model: Any,
    prompt_ids: Any,
    prompt_mask: Any,
    completions: Sequence[Sequence[int]],
    temperature: float = 0.0,
) -> list[list[float]]:
    """Log-probabilities of each completion's tokens after its (left-padded) prompt.

    One teacher-forced forward over prompt + completion (right-padded), under the same
    distribution ``Completion.logprobs`` uses (logits / temperature, 0 counts as 1).
    """
    import torch

    device = prompt_ids.device
    n_new = max((len(c) for c in completions), default=0)
    if n_new == 0:
        return [[] for _ in completions]
    comp = torch.zeros((len(completions), n_new), dtype=torch.long, device=device)
    comp_mask = torch.zeros_like(comp)
    for row, c in enumerate(completions):
        comp[row, : len(c)] = torch.tensor(list(c), dtype=torch.long)
        comp_mask[row, : len(c)] = 1
    ids = torch.cat([prompt_ids, comp], dim=1)
    mask = torch.cat([prompt_mask, comp_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    width = prompt_ids.shape[1]
    with torch.inference_mode():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
        ).logits[:, width - 1 : -1, :]
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    lp = torch.log_softmax(logits, dim=-1).gather(2, comp[:, :, None]).squeeze(2)
    return [lp[row, : len(c)].tolist() for row, c in enumerate(completions)]


def generate(model: Any, tokenizer: Any, prompts: Sequence[Prompt], **kwargs: Any) -> list[str]:
    """Convenience wrapper: ``Generator(model, tokenizer).generate(prompts, **kwargs)``."""
    return Generator(model, tokenizer).generate(prompts, **kwargs)
