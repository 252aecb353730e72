"""JSON over HTTP to an AgentGym env server (``RetryingHttp``).

Retries are for I/O only, never for application errors, and never where a retry could
apply an action twice: a request that never reached the server (connection refused,
connect timeout) and a 503 ("not processed, busy") are retried for every request; a read
timeout, a dropped connection or another 5xx is retried only for idempotent requests
(reset of the same item, observation, available actions, close); for ``step`` and
``create`` it fails the episode (EnvError), as the server may have applied it. 4xx and
``{"error"}`` answers fail at once.
"""

from __future__ import annotations

import time
from typing import Any

from components.envs.base import EnvError

MAX_BACKOFF_S = 10.0


class RetryingHttp:
    """JSON over HTTP with the retry rules of the module docstring."""

    def __init__(self, base_url: str, timeout_s: float, max_retries: int, backoff_s: float):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.client: httpx.Client | None = None  # opened on the first request

    def _client(self) -> Any:
        import httpx

        if self.client is None:  # again after close: an env is reset after a failed episode
            self.client = httpx.Client(base_url=self.base_url, timeout=self.timeout_s)
        return self.client

    def request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool,
    ) -> Any:
        """The decoded JSON answer; raises EnvError once retries are spent or not allowed."""
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                response = self._client().request(method, path, json=json, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:  # never reached it
                last = f"{type(err).__name__}: {err}"
                continue
            except httpx.TransportError as err:  # read timeout, dropped connection...
                last = f"{type(err).__name__}: {err}"
                if idempotent:
                    continue
                raise EnvError(f"{method} {path}: {last} (not retried: may have applied)") from err
            if response.status_code == 503 or (response.status_code >= 500 and idempotent):
                last = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise EnvError(
                    f"{method} {path}: HTTP {response.status_code}: {response.text[:200]}"
                )
            try:
                body = response.json()
            except ValueError as err:
                raise EnvError(f"{method} {path}: not JSON: {response.text[:200]}") from err
            if isinstance(body, dict) and "error" in body:
                raise EnvError(f"{method} {path}: server error: {body['error']}")
            return body
        raise EnvError(f"{method} {path} failed after {self.max_retries + 1} tries: {last}")

    def close(self) -> None:
        """Close the connection pool (the next request opens a new one)."""
        if self.client is not None:
            self.client.close()
            self.client = None
