"""Local transformers teacher: a causal LM by hub name or local path, batched generation.

The first attempt decodes greedily (or with cfg.temperature); malformed answers are
re-sampled (temperature >= 0.7, else the retry would repeat itself) up to
cfg.max_retries times, then counted as failed. No token is ever guessed or repaired.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from components.config import TeacherConfig
from components.teacher.base import (
    Annotation,
    AnnotationRequest,
    MalformedAnswerError,
    OnResult,
    TeacherError,
    answer,
    parse_reasoning,
)
from components.teacher.prompt import build_messages

log = logging.getLogger(__name__)
RETRY_TEMPERATURE = 0.7


class HFTeacher:
    """Teacher backed by a local transformers causal LM (no cost, token counts only)."""

    backend = "hf"
    budget_exhausted = False

    def __init__(
        self,
        cfg: TeacherConfig,
        *,
        model: Any = None,
        tokenizer: Any = None,
        device: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.model = cfg.model
        self.batch_size = cfg.batch_size
        try:
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(cfg.model)
            lm = model or AutoModelForCausalLM.from_pretrained(cfg.model, dtype="auto")
        except OSError as e:
            raise TeacherError(f"cannot load teacher model {cfg.model!r}: {e}") from None
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.lm = lm.to(self.device).eval()
        tok = self.tokenizer
        tok.padding_side = "left"  # decoder-only batching: prompts end at the same column
        if tok.pad_token is None:
            if tok.eos_token is None:
                raise TeacherError(f"tokenizer of {cfg.model!r} has neither pad nor eos token")
            tok.pad_token = tok.eos_token
        self._templated = bool(getattr(tok, "chat_template", None))

    def __repr__(self) -> str:
        return f"HFTeacher(model={self.model!r}, device={self.device!r})"

    def close(self) -> None:
        """Nothing to release (kept for interface symmetry)."""

    def render(self, req: AnnotationRequest) -> str:
        """The prompt text: the chat template if the tokenizer has one, else plain turns."""
        messages = build_messages(req)
        if self._templated:
            try:
                return str(
                    self.tokenizer.apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=True
                    )
                )
            except Exception:
                # Some templates reject a system role: fold it into the user turn.
                merged = [
                    {
                        "role": "user",
                        "content": messages[0]["content"] + "\n\n" + messages[1]["content"],
                    }
                ]
                return str(
                    self.tokenizer.apply_chat_template(
                        merged, tokenize=False, add_generation_prompt=True
                    )
                )
        return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages) + (
            "\n\nAssistant:"
        )

    def generate(self, prompts: list[str], sample: bool) -> list[tuple[str, int, int]]:
        """Generate for a batch of prompts: (text, prompt_tokens, completion_tokens) each."""
        import torch

        tok = self.tokenizer
        # A rendered chat template already holds its BOS; don't add a second one.
        enc = tok(
            prompts, return_tensors="pt", padding=True, add_special_tokens=not self._templated
        ).to(self.device)
        kwargs: dict[str, Any] = {"max_new_tokens": self.cfg.max_tokens}
        temperature = self.cfg.temperature
        if sample:
            temperature = max(temperature, RETRY_TEMPERATURE)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=0.95)
        else:
            kwargs.update(do_sample=False)
        with torch.inference_mode():
            out = self.lm.generate(**enc, pad_token_id=tok.pad_token_id, **kwargs)
        new = out[:, enc["input_ids"].shape[1] :]
        stop_ids = {tok.pad_token_id, tok.eos_token_id} - {None}
        results = []
        for i in range(len(prompts)):
            row = new[i].tolist()
            n = next((j + 1 for j, t in enumerate(row) if t in stop_ids), len(row))
            text = tok.decode(row[:n], skip_special_tokens=True)
            results.append((text, int(enc["attention_mask"][i].sum()), n))
        return results

    def annotate(
        self, batch: Sequence[AnnotationRequest], on_result: OnResult | None = None
    ) -> list[Annotation]:
        """Annotate in generate batches of cfg.batch_size; malformed answers are re-sampled."""
        prompts = [self.render(r) for r in batch]
        final: dict[int, Annotation] = {}
        tokens = {i: [0, 0] for i in range(len(batch))}
        last: dict[int, tuple[str, str]] = {}
        pending = list(range(len(batch)))
        for attempt in range(self.cfg.max_retries + 1):
            if not pending:
                break
            still: list[int] = []
            for lo in range(0, len(pending), self.batch_size):
                idx = pending[lo : lo + self.batch_size]
                outs = self.generate([prompts[i] for i in idx], sample=attempt > 0)
                for i, (text, p_tok, c_tok) in zip(idx, outs, strict=True):
                    tokens[i][0] += p_tok
                    tokens[i][1] += c_tok
                    try:
                        reasoning = parse_reasoning(text)
                    except MalformedAnswerError as e:
                        last[i] = (f"malformed answer: {e}", text)
                        still.append(i)
                        continue
                    final[i] = answer(
                        batch[i], "ok", self, tokens[i], attempt + 1, reasoning=reasoning
                    )
                    if on_result is not None:
                        on_result(final[i])
            pending = still
        for i in pending:
            error, text = last[i]
            final[i] = answer(
                batch[i], "failed", self, tokens[i], self.cfg.max_retries + 1, error=error, raw=text
            )
            if on_result is not None:
                on_result(final[i])
        if pending:
            log.warning("hf teacher: %d/%d answers malformed", len(pending), len(batch))
        return [final[i] for i in range(len(batch))]
