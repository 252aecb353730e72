"""Retry policy shared by the clients of OpenAI-compatible servers (teacher, generation).

What is retried and how long to wait: timeouts, dropped connections, 408/409/429 and
5xx are transient (exponential backoff with "equal jitter"; a 429 honours Retry-After);
401/403/404 are configuration errors that every request would hit (stop at once); other
4xx fail only the request that caused them. ``Redactor`` removes the API key (and any
bearer token or ``sk-...`` string) from every message a client logs or raises.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from typing import Any, Literal

MAX_RETRY_AFTER_S = 600.0
RETRY_STATUS = frozenset({408, 409, 429})
FATAL_STATUS = frozenset({401, 403, 404})
REDACTED = "***"
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',}]+")
_SK = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")

StatusAction = Literal["retry", "fatal", "fail"]


class Redactor:
    """Removes secrets (the key, any bearer token, sk-... strings) from text."""

    def __init__(self, *secrets: str) -> None:
        self._secrets = tuple(s for s in secrets if s and len(s) >= 4)

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
