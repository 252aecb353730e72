"""A small batched generation backend over a transformers causal LM.

Prompts are chat messages (rendered with the tokenizer's chat template and the
generation prompt) or raw strings. They are sorted by length and batched with left
padding; decoding is greedy (temperature 0) or sampled; a sequence stops at eos, at the
first stop string (``</reward>`` for the experience model) or after ``max_new_tokens``.
Kept simple and correct on purpose: a later issue optimises it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Prompt = list[dict[str, str]] | str

DEFAULT_STOP = ("</reward>",)


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


class Generator:
    """Batched generation with one model and tokenizer."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = DEFAULT_STOP,
        batch_size: int = 8,
        seed: int | None = None,
    ) -> list[str]:
        """Completions for ``prompts`` in input order, each cut after the first stop string."""
        import torch

        if not prompts:
            return []
        texts = render_prompts(self.tokenizer, prompts)
        encoded = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        # longest first: similar lengths share a batch (less padding), OOM shows up at once
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        out: list[str] = [""] * len(encoded)
        if seed is not None:
            torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                batch = self._generate_batch(
                    [encoded[i] for i in idx], max_new_tokens, temperature, top_p, stop
                )
                for i, text in zip(idx, batch, strict=True):
                    out[i] = text
        finally:
            self.model.train(was_training)
        return out

    def _generate_batch(
        self,
        encoded: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
    ) -> list[str]:
        import torch

        tok = self.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(len(e) for e in encoded)
        device = next(self.model.parameters()).device
        # left padding: every prompt ends at the same position, so new tokens line up
        input_ids = torch.tensor(
            [[pad_id] * (width - len(e)) + e for e in encoded], dtype=torch.long, device=device
        )
        attention = torch.tensor(
            [[0] * (width - len(e)) + [1] * len(e) for e in encoded],
            dtype=torch.long,
            device=device,
        )
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "pad_token_id": pad_id,
            "eos_token_id": tok.eos_token_id,
        }
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs["stopping_criteria"] = _stopping(tok, stop, width)
        with torch.inference_mode():
            generated = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        new = generated[:, width:]
        texts = tok.batch_decode(new, skip_special_tokens=True)
        return [cut_at_stop(t, stop) for t in texts]


def _stopping(tokenizer: Any, stop: Sequence[str], prompt_width: int) -> Any:
    from transformers import StoppingCriteria, StoppingCriteriaList

    tail = 16  # tokens decoded per check: enough for any stop tag, cheap per step

    class _StopStrings(StoppingCriteria):
        # per-sequence: a finished sequence is padded while the others continue
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            import torch

            new = input_ids[:, prompt_width:][:, -tail:]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            return torch.tensor(
                [any(s in t for s in stop) for t in texts],
                dtype=torch.bool,
                device=input_ids.device,
            )

    return StoppingCriteriaList([_StopStrings()])


def generate(model: Any, tokenizer: Any, prompts: Sequence[Prompt], **kwargs: Any) -> list[str]:
    """Convenience wrapper: ``Generator(model, tokenizer).generate(prompts, **kwargs)``."""
    return Generator(model, tokenizer).generate(prompts, **kwargs)
