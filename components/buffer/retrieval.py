"""Retrieval: k nearest transitions by cosine distance on ``embed_text(task, state, action)``.

Exact (flat) search below ``buffer.index_min_rows`` rows, the IVF_FLAT index from there
on (20% of its partitions and at least 36 probed: recall@10 >= 0.95 vs exact in
``bench/buffer.py``); a filter that leaves fewer than k matches in the probed partitions
makes the search probe on until k are found. A ``Transition`` query never retrieves rows
of its own episode (leakage).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.buffer.embedders import embed_text, normalize_rows
from components.buffer.schema import RESULT_COLUMNS, VECTOR_COLUMN, row_to_transition
from components.buffer.table import BufferTable
from components.schema import Source, Transition

NPROBES_FRACTION = 0.2
NPROBES_MIN = 36


def ivf_nprobes(partitions: int) -> int:
    """Partitions probed per query: 20% and at least 36 (bench: recall@10 >= 0.95)."""
    # Measured on 384-d clustered data: ~35 probes reach recall 0.97 at 10K-50K rows,
    # 100K rows needs ~20% of sqrt(N) partitions; 10% lost recall (0.89 at 10K rows).
    return min(partitions, max(NPROBES_MIN, math.ceil(NPROBES_FRACTION * partitions)))


def sql_literal(value: str) -> str:
    """A string as a quoted SQL literal."""
    return "'" + value.replace("'", "''") + "'"


def filter_sql(
    env: str | None = None, exclude_episode: str | None = None, source: Source | None = None
) -> str | None:
    """The SQL predicate for retrieval filters (None = no filter)."""
    parts = []
    if env is not None:
        parts.append(f"env = {sql_literal(env)}")
    if exclude_episode is not None:
        parts.append(f"episode_id != {sql_literal(exclude_episode)}")
    if source is not None:
        if source not in ("real", "synthetic"):
            raise ValueError(f"source must be 'real', 'synthetic' or None, got {source!r}")
        parts.append(f"source = {sql_literal(source)}")
    return " AND ".join(parts) or None


class RetrievalMixin(BufferTable):
    """Nearest-neighbour search over the table, with per-handle statistics."""

    def _query_vectors(self, queries: Sequence[Transition | str | np.ndarray]) -> np.ndarray:
        texts: list[str] = []
        slots: list[int] = []
        out = np.zeros((len(queries), self.dim), dtype=np.float32)
        for i, q in enumerate(queries):
            if isinstance(q, Transition):
                texts.append(embed_text(q.instruction, q.state, q.action))
                slots.append(i)
            elif isinstance(q, str):
                texts.append(q)
                slots.append(i)
            else:
                v = np.asarray(q, dtype=np.float32).reshape(1, -1)
                self._check_embedder_dim(v)
                out[i] = normalize_rows(v)[0]
        if texts:
            out[slots] = self._embed_unique(texts)
        return out

    def retrieve(
        self,
        query: Transition | str | np.ndarray,
        k: int | None = None,
        *,
        env: str | None = None,
        exclude_episode: str | None = None,
        source: Source | None = None,
        exact: bool = False,
    ) -> list[tuple[Transition, float]]:
        """k nearest (transition, cosine distance) pairs; a Transition skips its own episode."""
        return self.retrieve_many(
            [query], k, env=env, exclude_episodes=[exclude_episode], source=source, exact=exact
        )[0]

    def retrieve_many(
        self,
        queries: Sequence[Transition | str | np.ndarray],
        k: int | None = None,
        *,
        env: str | None = None,
        exclude_episodes: Sequence[str | None] | None = None,
        source: Source | None = None,
        exact: bool = False,
    ) -> list[list[tuple[Transition, float]]]:
        """``retrieve`` for many queries, embedding them in one batch."""
        k = self.cfg.k if k is None else k
        if k < 0:
            raise ValueError("k must be >= 0")
        if exclude_episodes is not None and len(exclude_episodes) != len(queries):
            raise ValueError("exclude_episodes must have one entry per query")
        if k == 0 or not queries:
            return [[] for _ in queries]
        vecs = self._query_vectors(queries)
        idx = self._vector_index()
        out = []
        for i, q in enumerate(queries):
            excl = exclude_episodes[i] if exclude_episodes is not None else None
            if excl is None and isinstance(q, Transition):
                excl = q.episode_id  # never ground a transition on its own episode
            out.append(self._search(vecs[i], k, filter_sql(env, excl, source), idx, exact))
        return out

    def _search(
        self,
        vec: np.ndarray,
        k: int,
        where: str | None,
        idx: tuple[str, int] | None,
        exact: bool,
    ) -> list[tuple[Transition, float]]:
        start = time.perf_counter()
        if idx is not None and not exact and not self._prewarmed:
            with self._io("prewarm index"):
                self._table.prewarm_index(idx[0])  # load IVF partitions once, not per query
            self._prewarmed = True

        def query(unbounded: bool) -> list[dict[str, Any]]:
            with self._io("search"):
                q = (
                    self._table.search(vec, vector_column_name=VECTOR_COLUMN)
                    .distance_type("cosine")
                    .select([*RESULT_COLUMNS, "_distance"])
                    .limit(k)
                )
                if where:
                    q = q.where(where, prefilter=True)
                if exact:
                    q = q.bypass_vector_index()
                elif idx is not None:
                    nprobes = ivf_nprobes(idx[1])
                    q = (
                        q.minimum_nprobes(nprobes).maximum_nprobes(0)
                        if unbounded
                        else q.nprobes(nprobes)
                    )
                return q.to_arrow().to_pylist()

        rows = query(unbounded=False)
        if where and idx is not None and not exact and len(rows) < k:
            # a selective filter can leave the probed partitions short of k matches:
            # keep probing until k are found (or the table is exhausted)
            rows = query(unbounded=True)
        hits = [(row_to_transition(r, self.table_dir), float(r["_distance"])) for r in rows]
        self._retrievals.record(time.perf_counter() - start, hits, k)
        return hits

    def retrieval_stats(self, reset: bool = False) -> dict[str, float]:
        """Latency and result statistics of the retrievals made through this handle."""
        out = self._retrievals.summary()
        if reset:
            self._retrievals.clear()
        return out
