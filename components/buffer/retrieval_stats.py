"""Per-handle retrieval statistics: latency percentiles and what the queries found."""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from components.schema import Transition


class RetrievalStats:
    """Latencies and result counts of the retrievals made through one handle."""

    def __init__(self, latency_window: int) -> None:
        self._latencies: deque[float] = deque(maxlen=latency_window)
        self.clear()

    def clear(self) -> None:
        """Forget every recorded query."""
        self._latencies.clear()
        self._counts: Counter[str] = Counter()
        self._sums: dict[str, float] = {"top1_distance": 0.0, "distance": 0.0}

    def record(self, seconds: float, hits: list[tuple[Transition, float]], k: int) -> None:
        """Account one query that took ``seconds`` and found ``hits`` of ``k`` asked."""
        self._latencies.append(seconds)
        self._counts["queries"] += 1
        self._counts["results"] += len(hits)
        self._counts["real_results"] += sum(t.source == "real" for t, _ in hits)
        if len(hits) < k:
            self._counts["short_queries"] += 1
        if hits:
            self._sums["top1_distance"] += hits[0][1]
            self._sums["distance"] += sum(d for _, d in hits)

    def summary(self) -> dict[str, float]:
        """Latency percentiles and mean result statistics (plain floats)."""
        n = self._counts["queries"]
        results = self._counts["results"]
        lat = np.array(self._latencies) * 1000 if self._latencies else np.zeros(1)
        return {
            "retrieval_queries": float(n),
            "retrieval_p50_ms": float(np.percentile(lat, 50)),
            "retrieval_p99_ms": float(np.percentile(lat, 99)),
            "retrieval_mean_top1_distance": self._sums["top1_distance"] / max(n, 1),
            "retrieval_mean_distance": self._sums["distance"] / max(results, 1),
            "retrieval_frac_real": self._counts["real_results"] / max(results, 1),
            "retrieval_frac_short": self._counts["short_queries"] / max(n, 1),
        }
