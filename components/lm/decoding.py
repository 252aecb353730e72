"""Token-level decoding under ``Generator``: the fast path's decode loop over a
preallocated KV cache, the choice of each token (greedy or nucleus sampling), teacher-forced
scoring of answers, and the shape and thread helpers. torch and transformers are imported
inside the functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from components.lm.completion import FinishReason


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


def decode_loop(
    model: Any,
    ids: Any,
    mask: Any,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    rng: Any,
    logprobs: bool,
    eos: set[int],
    stopped: Callable[[str, list[int]], tuple[bool, str]],
) -> list[tuple[list[int], list[float], FinishReason]]:
    """Tokens, their logprobs (empty unless ``logprobs``) and finish reason of each row.

    ``ids``/``mask``: the left-padded prompts. One prefill keeps only the last position's
    logits, then one token per step for the rows still running: a row that draws an eos
    token, or whose ``stopped(tail, tokens)`` says so, leaves the batch and the KV cache.
    """
    import torch

    n = ids.shape[0]
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
    attend = torch.ones((n, ids.shape[1] + max_new_tokens), dtype=torch.bool)
    attend = attend.to(mask.device)
    attend[:, : ids.shape[1]] = mask.bool()
    alive = list(range(n))  # original row of each row still in the batch
    tokens: list[list[int]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    tails = [""] * n
    reasons: list[FinishReason] = ["length"] * n
    for step in range(max_new_tokens):
        chosen, chosen_lp = pick_tokens(logits, temperature, top_p, rng, logprobs)
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
            hit, tails[row] = stopped(tails[row], tokens[row])
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
    return [(tokens[r], logps[r], reasons[r]) for r in range(n)]


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


def pick_tokens(
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
