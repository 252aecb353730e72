"""Retry policy shared by the clients of OpenAI-compatible servers (teacher, generation).

What is retried and how long to wait: timeouts, dropped connections, 408/409/429 and
5xx are transient (exponential backoff with "equal jitter"; a 429 honours Retry-After);
401/403/404 are configuration errors that every request would hit (stop at once); other
4xx fail only the request that caused them. ``Redactor`` removes the API key (and any
bearer token or ``sk-...`` string) from every message a client logs or raises.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

MAX_RETRY_AFTER_S = 600.0
RETRY_STATUS = frozenset({408, 409, 429})
FATAL_STATUS = frozenset({401, 403, 404})
REDACTED = "***"
EMPTY_KEY = "EMPTY"  # local OpenAI-compatible servers (vLLM) accept any key
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',}]+")
_SK = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")

StatusAction = Literal["retry", "fatal", "fail"]


class Redactor:
    """Removes secrets (the key, any bearer token, sk-... strings) from text."""

    def __init__(self, *secrets: str) -> None:
        from urllib.parse import quote

        # the keyless placeholder is no secret: blanking it would garble plain words
        kept = [s for s in secrets if s and len(s) >= 4 and s != EMPTY_KEY]
        # as a server may echo them: plain and URL-encoded
        self._secrets = tuple(dict.fromkeys([*kept, *(quote(s, safe="") for s in kept)]))

    def __call__(self, text: object) -> str:
        """Redacted string form of ``text``."""
        out = str(text)
        for s in self._secrets:
            out = out.replace(s, REDACTED)
        out = _BEARER.sub(lambda m: m.group(1) + REDACTED, out)
        return _SK.sub(REDACTED, out)

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secret(s))"


def status_action(code: int) -> StatusAction:
    """What to do after an HTTP error status: retry it, stop everything, or fail the item."""
    if code in FATAL_STATUS:
        return "fatal"
    if code in RETRY_STATUS or code >= 500:
        return "retry"
    return "fail"


def backoff_s(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Delay before retry ``attempt`` (0-based): at least half the doubled step, capped."""
    cap = min(max_s, base_s * 2**attempt)
    return cap / 2 + rng.uniform(0, cap / 2)


def retry_after_s(headers: Any) -> float | None:
    """Seconds from Retry-After-Ms / Retry-After (seconds or HTTP date), if any."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


class Backoff:
    """``backoff_s`` with the client's settings and one random source shared by threads."""

    def __init__(self, base_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.base_s, self.max_s = base_s, max_s
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    def __call__(self, attempt: int) -> float:
        """Delay before retry ``attempt`` (0-based)."""
        with self._lock:
            return backoff_s(attempt, self.base_s, self.max_s, self._rng)

    def retry_wait(
        self,
        attempt: int,
        max_retries: int,
        delay: float | None,
        logger: logging.Logger,
        what: str,
        error: str,
    ) -> float | None:
        """The logged wait before retrying after failed ``attempt`` (``delay`` when the failure
        named one, else the backoff); None when no retry is left."""
        if attempt == max_retries:
            return None
        if delay is None:
            delay = self(attempt)
        logger.warning(
            "%s failed (%s); retry %d/%d in %.2fs", what, error, attempt + 1, max_retries, delay
        )
        return delay


def api_key(env_name: str, base_url: str | None) -> str | None:
    """The key in ``env_name``; without one, ``EMPTY_KEY`` for a server URL, else None."""
    key = os.environ.get(env_name, "")
    if not key and base_url is not None:
        return EMPTY_KEY
    return key or None


def open_client(key: str, base_url: str | None, timeout_s: float) -> Any:
    """An ``openai.OpenAI`` client that never retries by itself (the caller's loop does)."""
    import openai

    return openai.OpenAI(api_key=key, base_url=base_url, timeout=timeout_s, max_retries=0)


class BadBody(ValueError):
    """A 200 response whose body is not a usable completion.

    ``usage``: what the server billed for it (``{}`` for a completion that came without a
    usage), None when the body says nothing (not JSON, cut): the caller still counts it.
    """

    def __init__(self, message: str, usage: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class NoContent(BadBody):
    """A whole completion without text (a refusal, tool calls only): a malformed answer,
    not a transport fault; ``refusal`` is the server's refusal text, if any."""

    def __init__(self, message: str, usage: dict[str, Any], refusal: str = "") -> None:
        super().__init__(message, usage)
        self.refusal = refusal


def response_text(resp: Any) -> str:
    """The body of a raw response; ``BadBody`` if it dies while being read."""
    try:
        return resp.http_response.text  # type: ignore[no-any-return]
    except Exception as e:
        raise BadBody(f"unreadable body: {type(e).__name__}") from None


def parse_body(body: str, *, chat: bool) -> tuple[str, Any, dict[str, Any] | None]:
    """(text, first choice, usage or None) of a completion JSON body; strict: ``BadBody``.

    ``chat``: only a chat completion's message content counts; else a choice may also be a
    plain completion's ``text``.
    """
    try:
        data = json.loads(body)
    except ValueError:
        raise BadBody(f"body is not JSON ({len(body)} bytes)") from None
    # read first: a 200 that is no usable answer is billed all the same
    usage = data.get("usage") if isinstance(data, dict) else None
    usage = usage if isinstance(usage, dict) else None
    try:
        choice = data["choices"][0]
        message = choice["message"] if chat or "message" in choice else None
        # content is null in a refusal or a tool-calls-only answer
        text = message.get("content") if message is not None else choice["text"]
    except (KeyError, IndexError, TypeError, AttributeError):
        kind = "chat completion" if chat else "completion"
        raise BadBody(f"body is JSON but not a {kind}", usage) from None
    if not isinstance(text, str):
        refusal = message.get("refusal") if message is not None else None
        refusal = refusal if isinstance(refusal, str) else ""
        detail = f" (refusal: {refusal[:200]!r})" if refusal else ""
        raise NoContent(f"completion has no text content{detail}", usage or {}, refusal)
    return text, choice, usage


@dataclass(frozen=True)
class Failure:
    """What one failed attempt means: its (redacted) error and what to do next."""

    action: StatusAction  # "retry" or "fail" (a fatal one is raised by ``classify``)
    error: str
    retry_after_s: float | None = None  # a 429's Retry-After, capped at MAX_RETRY_AFTER_S


def classify(
    e: Exception,
    redact: Redactor,
    timeout_s: float,
    *,
    halt: threading.Event,
    fatal: Callable[[str], Exception],
) -> Failure:
    """The failure an attempt's exception stands for: a timeout, a dropped connection, an
    HTTP error status, a ``BadBody`` or another ``openai.OpenAIError``. A configuration
    status (401/403/404) would fail every request: ``halt`` is set and ``fatal(error)``
    raised. Any other exception is not the client's: it is raised again."""
    import openai

    if isinstance(e, openai.APITimeoutError):  # before its base class APIConnectionError
        return Failure("retry", f"timeout after {timeout_s}s")
    if isinstance(e, openai.APIConnectionError):
        return Failure("retry", f"connection error: {redact(e)}")
    if isinstance(e, openai.APIStatusError):
        code = e.status_code
        error = f"HTTP {code}: {redact(e.message)}"
        action = status_action(code)
        if action == "fatal":
            halt.set()
            raise fatal(error) from None
        after = retry_after_s(e.response.headers) if code == 429 else None
        return Failure(action, error, None if after is None else min(after, MAX_RETRY_AFTER_S))
    if isinstance(e, NoContent):  # an answer, not a fault: re-ask at once, no backoff
        return Failure("retry", f"malformed answer: {e}", 0.0)
    if isinstance(e, BadBody):
        return Failure("retry", f"bad response body: {e}")
    if isinstance(e, openai.OpenAIError):  # anything else the client raises
        return Failure("fail", f"{type(e).__name__}: {redact(e)}")
    raise e
