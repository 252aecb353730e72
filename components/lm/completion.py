"""What every generation backend shares: prompt and answer types, the backend protocols,
and the handling of answer text (chat prompts rendered, answers cut at the first stop string).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Prompt = list[dict[str, str]] | str
FinishReason = Literal["stop", "eos", "length", "error"]

DEFAULT_STOP = ("</reward>",)


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
