"""Generation over an OpenAI-compatible server (vLLM serving the experience model or policy).

The same interface as the local ``Generator``: ``generate(prompts, *, max_new_tokens,
temperature, top_p, stop, batch_size, seed) -> list[str]`` in input order, each answer
cut after its first stop string. Chat prompts go to ``/v1/chat/completions``, raw strings
to ``/v1/completions``. Requests run concurrently (a thread pool; the server batches
them) and are retried with the shared policy of ``components.lm.retry``: timeouts,
dropped connections, unreadable bodies, 408/409/429 and 5xx with exponential backoff (429
honours Retry-After); 401/403/404 stop the call at once; a 400/422 or exhausted retries
raise ``GenerationError`` (or, with ``on_failure="empty"``, give an empty "error" answer
that the caller's parser counts as malformed).

Stop strings: OpenAI-style servers cut *before* the stop string and drop it. vLLM keeps it
with ``include_stop_str_in_output`` (sent when ``vllm_extensions``) and names the matched
string in ``stop_reason``, which is appended back when the server dropped it, so answers
end in ``</reward>`` exactly like local ones. With a seed, prompt ``i`` is sent seed + i:
the n rollouts of one task (the same prompt n times) must not be identical samples.

The server URL and API key come from environment variables named in the config (or an
explicit ``base_url``); the key is redacted from every message this module logs or raises.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.lm.generate import (
    DEFAULT_STOP,
    Completion,
    CompletionBackend,
    FinishReason,
    Prompt,
    cut_at_stop,
)
from components.lm.retry import (
    Backoff,
    Redactor,
    api_key,
    classify,
    open_client,
    parse_body,
    response_text,
)

log = logging.getLogger(__name__)

MAX_STOP_STRINGS = 4  # the OpenAI API's limit; vLLM accepts more


class GenerationError(RuntimeError):
    """A generation request failed for good (message redacted)."""


class OpenAIBackendConfig(BaseModel):
    """Where the server is and how hard to try."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="served model name (vLLM --served-model-name)")
    base_url: str | None = Field(None, description="server URL; None: read base_url_env")
    base_url_env: str = Field(
        "DREAMGYM_OPENAI_BASE_URL", description="env var holding the server URL (.../v1)"
    )
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the API key")
    concurrency: int = Field(32, ge=1, description="requests in flight")
    max_retries: int = Field(5, ge=0, description="retries on timeout/429/5xx/bad body")
    timeout_s: float = Field(120.0, gt=0, description="per-request timeout")
    backoff_base_s: float = Field(0.5, gt=0, description="first retry delay (doubles)")
    backoff_max_s: float = Field(30.0, gt=0, description="cap on one retry delay")
    vllm_extensions: bool = Field(
        True, description="send vLLM-only fields (include_stop_str_in_output)"
    )
    on_failure: Literal["raise", "empty"] = Field(
        "raise", description="a request that failed for good: raise, or an empty answer"
    )
    add_special_tokens: bool | None = Field(
        None,
        description="vLLM: tokenise raw-string prompts with (true) or without (false) special "
        "tokens such as BOS (None: the server's default); false for prompts already rendered "
        "with a chat template",
    )
    return_token_ids: bool = Field(
        False, description="vLLM: ask for the generated token ids (Completion.token_ids)"
    )


class _Fatal(Exception):
    """Every request would fail the same way (configuration): stop the whole call."""


class _Halted(Exception):
    """This request gave up because another one failed for good."""


def _refused(error: str) -> _Fatal:
    return _Fatal(f"generation request refused, {error}")


class OpenAIBackend(CompletionBackend):
    """``GenerationBackend`` over an OpenAI-compatible HTTP server."""

    def __init__(self, cfg: OpenAIBackendConfig, *, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.base_url = cfg.base_url or os.environ.get(cfg.base_url_env) or None
        key = api_key(cfg.api_key_env, self.base_url)
        if key is None:
            raise GenerationError(
                f"no server: set {cfg.base_url_env} (or base_url) for a local server, "
                f"or the API key in {cfg.api_key_env}"
            )
        self._redact = Redactor(key)
        self._backoff = Backoff(cfg.backoff_base_s, cfg.backoff_max_s, rng)
        self._client = open_client(key, self.base_url, cfg.timeout_s)

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.cfg.model!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def complete(
        self,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = DEFAULT_STOP,
        seed: int | None = None,
        **_: Any,
    ) -> list[Completion]:
        """Completions with finish reasons and the server's completion token counts
        (``batch_size`` is ignored: batching is the server's job)."""
        if not prompts:
            return []
        stop = tuple(stop)
        if len(stop) > MAX_STOP_STRINGS and not self.cfg.vllm_extensions:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings on an OpenAI server")
        params: dict[str, Any] = {
            "model": self.cfg.model,
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p if temperature > 0 else 1.0,
        }
        extra: dict[str, Any] = {}
        if stop:
            params["stop"] = list(stop)
            extra["include_stop_str_in_output"] = True
        if self.cfg.return_token_ids:
            extra["return_token_ids"] = True
        if self.cfg.vllm_extensions and extra:
            params["extra_body"] = extra
        out: list[Completion | None] = [None] * len(prompts)
        halt = threading.Event()
        workers = max(1, min(self.cfg.concurrency, len(prompts)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(
                    self._one,
                    p,
                    {**params, **({"seed": seed + i} if seed is not None else {})},
                    stop,
                    halt,
                ): i
                for i, p in enumerate(prompts)
            }
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            if pending:  # a request failed for good: the others give up instead of sending
                halt.set()
                for fut in pending:
                    fut.cancel()
                wait(pending)
        errors = [f.exception() for f in futures if not f.cancelled() and f.exception()]
        if errors:  # report the cause, not the requests it stopped
            cause = next((e for e in errors if not isinstance(e, _Halted)), errors[0])
            raise GenerationError(str(cause)) from None
        for fut, i in futures.items():
            out[i] = fut.result()
        return [c for c in out if c is not None]

    # -- one request with retries ---------------------------------------------------------

    def _one(
        self, prompt: Prompt, params: dict[str, Any], stop: tuple[str, ...], halt: threading.Event
    ) -> Completion:
        cfg = self.cfg
        error = "no attempt made"
        for attempt in range(cfg.max_retries + 1):
            if halt.is_set():
                raise _Halted("stopped: another request failed")
            delay: float | None = None
            try:
                return self._call(prompt, params, stop)
            except Exception as e:
                failure = classify(e, self._redact, cfg.timeout_s, halt=halt, fatal=_refused)
                error = failure.error
                if failure.action == "fail":
                    return self._failed(error)
                delay = failure.retry_after_s
            delay = self._backoff.retry_wait(
                attempt, cfg.max_retries, delay, log, "generation request", error
            )
            if delay is None:
                break
            if halt.wait(delay):
                raise _Halted("stopped: another request failed")
        return self._failed(f"{error} (after {cfg.max_retries} retries)")

    def _failed(self, error: str) -> Completion:
        if self.cfg.on_failure == "raise":
            raise GenerationError(self._redact(error))
        log.warning("generation request failed for good: %s", self._redact(error))
        return Completion("", (), (), "error", 0)

    def _call(self, prompt: Prompt, params: dict[str, Any], stop: tuple[str, ...]) -> Completion:
        """One HTTP attempt; the body is parsed here, strictly."""
        if isinstance(prompt, str):
            special = self.cfg.add_special_tokens
            if special is not None and self.cfg.vllm_extensions:
                extra = {**params.get("extra_body", {}), "add_special_tokens": special}
                params = {**params, "extra_body": extra}
            resp = self._client.completions.with_raw_response.create(prompt=prompt, **params)
        else:
            resp = self._client.chat.completions.with_raw_response.create(
                messages=prompt,  # type: ignore[arg-type]
                **params,
            )
        text, finish, stop_reason, n_tokens, token_ids = _parse(response_text(resp))
        dropped = isinstance(stop_reason, str) and stop_reason in stop and stop_reason not in text
        if finish == "stop" and dropped:  # the server cut before the stop string: put it back
            text += stop_reason
        cut = cut_at_stop(text, stop)
        reason: FinishReason
        if any(s in cut for s in stop):
            reason = "stop"
        elif finish == "length":
            reason = "length"
        else:
            reason = "eos"
        # the server's ids run through the stop string's last token, like a local answer
        ids = token_ids if token_ids is not None and cut == text else ()
        return Completion(cut, ids, (), reason, n_tokens)


def _parse(body: str) -> tuple[str, str | None, Any, int, tuple[int, ...] | None]:
    """(text, finish_reason, stop_reason, completion tokens, token ids when the server sent
    them: vLLM's ``return_token_ids``) of a (chat) completion body."""
    text, choice, usage = parse_body(body, chat=False)
    n_tokens = int((usage or {}).get("completion_tokens") or 0)
    ids = choice.get("token_ids")
    ok = isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
    token_ids = tuple(ids) if ok else None
    return text, choice.get("finish_reason"), choice.get("stop_reason"), n_tokens, token_ids
