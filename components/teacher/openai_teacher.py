"""OpenAI-compatible teacher (GPT-4o, or any compatible server such as vLLM).

The official client is used with ``max_retries=0``; this module owns the retry loop so
that every attempt is budgeted and every failure is classified:
timeouts, connection drops (truncated bodies), 408/409/429/5xx, non-JSON or truncated
JSON bodies are retried with exponential backoff + jitter (429 honours Retry-After);
malformed answers (a refusal, with no text, is one) are re-sampled at once; 400/422 fail
the item; 401/403/404 stop the run (configuration). Every 200 that carries a usage (or
an answer) is counted against the budget, usable or not.
The API key is read from the environment variable named by the config and is redacted
from every message, error, log line and result this module produces.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from components.config import TeacherConfig
from components.lm.retry import MAX_RETRY_AFTER_S as MAX_RETRY_AFTER_S
from components.lm.retry import REDACTED as REDACTED
from components.lm.retry import (
    Backoff,
    BadBody,
    NoContent,
    api_key,
    classify,
    open_client,
    parse_body,
    response_text,
)
from components.lm.retry import Redactor as Redactor
from components.lm.retry import retry_after_s as _retry_after_s  # noqa: F401 (tests import it)
from components.teacher.base import (
    Annotation,
    AnnotationRequest,
    MalformedAnswerError,
    OnResult,
    Status,
    TeacherError,
    answer,
    parse_reasoning,
)
from components.teacher.prompt import build_messages

log = logging.getLogger(__name__)

# Public list prices, USD per 1M tokens (input, output). Longest matching prefix wins;
# override with teacher.price_input_per_mtok / price_output_per_mtok.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-2024-05-13": (5.00, 15.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
}
RETRY_TEMPERATURE = 0.7  # re-sample a malformed answer: a greedy retry would repeat it
# The retry policy, Redactor and Retry-After parsing live in components.lm.retry (shared
# with the generation backend); the names above stay importable from here.


@dataclass(frozen=True)
class Price:
    """USD per 1M prompt / completion tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for this many tokens."""
        usd_per_mtok = prompt_tokens * self.input_per_mtok
        usd_per_mtok += completion_tokens * self.output_per_mtok
        return usd_per_mtok / 1e6


def resolve_price(cfg: TeacherConfig) -> Price | None:
    """The config's price override, else the table's longest prefix match, else None."""
    table_hit = None
    for prefix in sorted(PRICES_PER_MTOK, key=len, reverse=True):
        if cfg.model == prefix or cfg.model.startswith(prefix + "-"):
            table_hit = PRICES_PER_MTOK[prefix]
            break
    p_in = cfg.price_input_per_mtok
    p_out = cfg.price_output_per_mtok
    if p_in is None and p_out is None and table_hit is None:
        return None
    return Price(
        p_in if p_in is not None else (table_hit[0] if table_hit else 0.0),
        p_out if p_out is not None else (table_hit[1] if table_hit else 0.0),
    )


def estimate_prompt_tokens(messages: Sequence[dict[str, str]]) -> int:
    """Upper-bound guess of prompt tokens (English is ~4 chars/token; 3 leaves a margin)."""
    return sum(len(m["content"]) // 3 + 8 for m in messages) + 8


class CostMeter:
    """Thread-safe spend tracking with reservations, so concurrency never overshoots."""

    def __init__(self, limit_usd: float | None) -> None:
        self.limit_usd = limit_usd
        self.spent_usd = 0.0
        self._reserved = 0.0
        self._exhausted = False
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        """True once a request was refused for lack of budget (sticky)."""
        return self._exhausted

    def reserve(self, worst_case_usd: float) -> bool:
        """Hold the worst-case cost of one request; False (and exhausted) if it won't fit."""
        with self._lock:
            if self._exhausted:
                return False
            if (
                self.limit_usd is not None
                and self.spent_usd + self._reserved + worst_case_usd > self.limit_usd
            ):
                self._exhausted = True
                return False
            self._reserved += worst_case_usd
            return True

    def settle(self, reserved_usd: float, actual_usd: float) -> None:
        """Replace a reservation by the actual cost (0 when nothing was billed)."""
        with self._lock:
            self._reserved = max(0.0, self._reserved - reserved_usd)
            self.spent_usd += actual_usd


def _parse_completion(text: str) -> tuple[str, str | None, dict[str, Any] | None]:
    """(content, finish_reason, usage) from a chat-completion JSON body."""
    content, choice, usage = parse_body(text, chat=True)
    return content, choice.get("finish_reason"), usage


def _refused(error: str) -> TeacherError:
    return TeacherError(f"teacher request refused, {error}")


class OpenAITeacher:
    """Teacher calling ``/v1/chat/completions`` of OpenAI or a compatible server."""

    backend = "openai"

    def __init__(self, cfg: TeacherConfig, *, rng: random.Random | None = None) -> None:
        key = api_key(cfg.api_key_env, cfg.base_url)
        if key is None:
            raise TeacherError(
                f"teacher.backend=openai needs an API key in the environment variable "
                f"{cfg.api_key_env} (or set teacher.base_url for a local server)"
            )
        self.cfg = cfg
        self.model = cfg.model
        self.batch_size = max(1, cfg.concurrency * 2)
        self.price = resolve_price(cfg)
        if cfg.max_cost_usd is not None and self.price is None:
            raise TeacherError(
                f"teacher.max_cost_usd is set but no price is known for model {cfg.model!r}: "
                "set teacher.price_input_per_mtok and teacher.price_output_per_mtok"
            )
        self.meter = CostMeter(cfg.max_cost_usd)
        self._redact = Redactor(key)
        # "equal jitter": at least half the step, spread over the rest
        self._backoff = Backoff(cfg.backoff_base_s, cfg.backoff_max_s, rng)
        self._client = open_client(key, cfg.base_url, cfg.timeout_s)

    @property
    def budget_exhausted(self) -> bool:
        """True once the cost budget refused a request."""
        return self.meter.exhausted

    @property
    def spent_usd(self) -> float:
        """Total billed cost of this teacher so far."""
        return self.meter.spent_usd

    def __repr__(self) -> str:
        return (
            f"OpenAITeacher(model={self.model!r}, base_url={self.cfg.base_url!r}, "
            f"concurrency={self.cfg.concurrency})"
        )

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def annotate(
        self, batch: Sequence[AnnotationRequest], on_result: OnResult | None = None
    ) -> list[Annotation]:
        """Annotate concurrently (cfg.concurrency); results in input order."""
        results: list[Annotation | None] = [None] * len(batch)
        stop = threading.Event()
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.cfg.concurrency, len(batch))))
        futures: dict[Future[Annotation], int] = {
            pool.submit(self._annotate_one, req, stop): i for i, req in enumerate(batch)
        }
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    ann = fut.result()  # TeacherError (fatal) propagates
                    results[futures[fut]] = ann
                    if on_result is not None:
                        on_result(ann)  # called from this thread only: writers need no lock
        except BaseException:
            stop.set()  # waiting workers return at once; in-flight calls end by timeout
            for fut in futures:
                fut.cancel()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return [r for r in results if r is not None]

    # -- one request with retries ---------------------------------------------------------

    def _annotate_one(self, req: AnnotationRequest, stop: threading.Event) -> Annotation:
        cfg = self.cfg
        messages = self._messages(req)
        worst_prompt = estimate_prompt_tokens(messages)
        tokens = [0, 0]  # prompt, completion over all attempts
        cost = 0.0
        error = "no attempt made"
        raw: str | None = None

        def result(status: Status, reasoning: str | None = None, attempts: int = 0) -> Annotation:
            return answer(
                req,
                status,
                self,
                tokens,
                attempts,
                reasoning=reasoning,
                error=None if status == "ok" else error,
                raw=raw,
                cost_usd=cost,
                redact=self._redact,
            )

        def charge(usage: dict[str, Any], content: str) -> float:
            """Count one answered attempt (estimated where its usage is missing); its cost."""
            nonlocal cost
            p_tok, c_tok = usage.get("prompt_tokens"), usage.get("completion_tokens")
            p_tok = int(worst_prompt if p_tok is None else p_tok)  # a reported 0 stays 0
            c_tok = int(len(content) // 3 + 1 if c_tok is None else c_tok)
            tokens[0] += p_tok
            tokens[1] += c_tok
            billed = self.price.cost(p_tok, c_tok) if self.price else 0.0
            cost += billed
            return billed

        attempts = 0
        temperature = cfg.temperature
        for attempt in range(cfg.max_retries + 1):
            if stop.is_set():
                error = "stopped"
                return result("skipped", attempts=attempts)
            worst = self.price.cost(worst_prompt, cfg.max_tokens) if self.price else 0.0
            if not self.meter.reserve(worst):
                error = (
                    f"budget exhausted: max_cost_usd={cfg.max_cost_usd} "
                    f"(spent {self.meter.spent_usd:.6f})"
                )
                return result("skipped", attempts=attempts)
            attempts += 1
            billed = 0.0
            delay: float | None = None
            try:
                content, finish, usage = self._call(messages, temperature)
                billed = charge(usage or {}, content)
                raw = content
                if finish == "length":
                    raise MalformedAnswerError(f"answer cut at max_tokens={cfg.max_tokens}")
                reasoning = self._parse(content)
                return result("ok", reasoning, attempts)
            except (MalformedAnswerError, NoContent) as e:
                if isinstance(e, NoContent):  # a refusal: billed, and answered all the same
                    billed = charge(e.usage or {}, e.refusal)
                    raw = e.refusal or None
                error = f"malformed answer: {e}"
                delay = 0.0  # a fresh sample, no reason to wait
                temperature = max(cfg.temperature, RETRY_TEMPERATURE)
            except Exception as e:
                if isinstance(e, BadBody) and e.usage is not None:  # a 200 the server billed
                    billed = charge(e.usage, "")
                # Authentication / permission / unknown model: every request would fail,
                # so the sibling workers stop before they send anything else.
                failure = classify(e, self._redact, cfg.timeout_s, halt=stop, fatal=_refused)
                error = failure.error
                if failure.action == "fail":
                    return result("failed", attempts=attempts)
                if failure.retry_after_s is not None:
                    delay = failure.retry_after_s + self._backoff(0) * 0.1
            finally:
                self.meter.settle(worst, billed)
            what = f"teacher request {req.id}"
            delay = self._backoff.retry_wait(
                attempt, cfg.max_retries, delay, log, what, self._redact(error)
            )
            if delay is None:
                break
            if delay > 0 and stop.wait(delay):
                error = "stopped"
                return result("skipped", attempts=attempts)
        return result("failed", attempts=attempts)

    def _messages(self, req: AnnotationRequest) -> list[dict[str, str]]:
        """The chat messages of one request (the judge reuses this loop with its own)."""
        return build_messages(req)

    def _parse(self, content: str) -> str:
        """The validated answer text; raises MalformedAnswerError (retried as malformed)."""
        return parse_reasoning(content)

    def _call(
        self, messages: list[dict[str, str]], temperature: float
    ) -> tuple[str, str | None, dict | None]:
        """One HTTP attempt; the body is parsed here, strictly, not by the client."""
        resp = self._client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=self.cfg.max_tokens,
            temperature=temperature,
        )
        return _parse_completion(response_text(resp))
