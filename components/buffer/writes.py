"""The write path: ``add`` merges on the transition id under the writers' lock and applies
the co-evolution cap; ``evict_synthetic`` applies it on demand; ``sync`` makes the table
hold exactly a given set of transitions (the seed buffer's rebuild).

``add`` is idempotent: existing rows win, and a batch with nothing new writes nothing (no
new table version) unless the table is over its cap. Incoming rows the cap would evict at
once are never written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from components.buffer.embedders import embed_text, normalize_rows
from components.buffer.eviction import (
    NO_EVICTION,
    Eviction,
    plan_add_eviction,
    plan_eviction,
    reservoir_key,
)
from components.buffer.index import IndexMixin
from components.buffer.retrieval import sql_literal
from components.buffer.schema import RESULT_COLUMNS, rows_to_arrow
from components.schema import Transition


@dataclass(frozen=True)
class AddResult:
    """What one ``add`` did (plain data, ready to log)."""

    received: int
    inserted: int
    already_present: int
    duplicates_in_batch: int
    rejected_by_cap: int
    evicted: int
    version: int
    embed_seconds: float
    write_seconds: float

    @property
    def changed(self) -> bool:
        """Whether the table was written."""
        return self.inserted > 0 or self.evicted > 0

    def as_dict(self) -> dict[str, float | int]:
        """Plain dict for logging."""
        return asdict(self)


class WritesMixin(IndexMixin):
    """Inserts (merge on id) and evictions; every write keeps the indexes up to date."""

    def add(
        self,
        transitions: Iterable[Transition],
        *,
        embeddings: np.ndarray | None = None,
        evict: bool = True,
    ) -> AddResult:
        """Insert transitions not yet present (merge on id); applies the synthetic cap."""
        self._require_writable()
        rows = list(transitions)
        for t in rows:
            if not isinstance(t, Transition):
                raise TypeError(f"add() takes Transition records, got {type(t).__name__}")
        if embeddings is not None:
            embeddings = normalize_rows(embeddings)
            if embeddings.shape[0] != len(rows):
                raise ValueError(f"{embeddings.shape[0]} embeddings for {len(rows)} transitions")
            self._check_embedder_dim(embeddings)
        first: dict[str, int] = {}
        for i, t in enumerate(rows):
            first.setdefault(t.id, i)
        duplicates = len(rows) - len(first)
        with self._write_lock():
            return self._add_new(rows, first, duplicates, embeddings, evict)

    def _add_new(
        self,
        rows: list[Transition],
        first: dict[str, int],
        duplicates: int,
        embeddings: np.ndarray | None,
        evict: bool,
    ) -> AddResult:
        """The read-check-write part of ``add`` (under the write lock, on the latest version)."""
        existing = self._scan(["id", "source", "iteration", "seq", "rkey"])
        present = set(existing["id"].to_pylist())
        new = [i for i in first.values() if rows[i].id not in present]
        seq0 = int(pc.max(existing["seq"]).as_py() or 0) + 1 if existing.num_rows else 0
        seqs = np.arange(seq0, seq0 + len(new), dtype=np.int64)
        rkeys = np.array([reservoir_key(rows[i].id) for i in new], dtype=np.int64)
        plan = NO_EVICTION
        # with nothing new too: a run killed between the insert and the eviction commit left
        # the table over its cap, and its rerun offers the same (now present) rows
        if evict:
            new_rows = [rows[i] for i in new]
            plan = plan_add_eviction(
                self.cfg.synthetic_cap, self.cfg.eviction, existing, new_rows, rkeys
            )
        keep = [j for j in range(len(new)) if j not in plan.reject_new]
        result = dict(
            received=len(rows),
            already_present=len(first) - len(new),
            duplicates_in_batch=duplicates,
            rejected_by_cap=len(new) - len(keep),
            embed_seconds=0.0,
            write_seconds=0.0,
        )
        if not keep and plan.delete_where is None:
            return AddResult(inserted=0, evicted=0, version=self.version, **result)
        batch = [rows[new[j]] for j in keep]
        t0 = time.perf_counter()
        if embeddings is not None:
            vecs = embeddings[[new[j] for j in keep]]
        else:
            vecs = self._embed_unique([embed_text(t.instruction, t.state, t.action) for t in batch])
        t1 = time.perf_counter()
        with self._io("add"):
            if batch:
                data = rows_to_arrow(
                    batch, vecs, seqs[keep], rkeys[keep], self._table.schema, self.dim
                )
                self._table.merge_insert("id").when_not_matched_insert_all().execute(data)
            if plan.delete_where is not None:
                self._table.delete(plan.delete_where)
        self._changed()
        self._maintain_index()
        t2 = time.perf_counter()
        result.update(embed_seconds=t1 - t0, write_seconds=t2 - t1)
        return AddResult(inserted=len(batch), evicted=plan.n_delete, version=self.version, **result)

    def sync(
        self, transitions: Iterable[Transition], *, embeddings: np.ndarray | None = None
    ) -> tuple[AddResult, int]:
        """Make the table hold exactly ``transitions``; returns (the add's result, rows deleted)."""
        # Rows whose id is gone, or whose stored content differs (an edited raw line keeps
        # its id), are deleted; ``add`` then inserts what is missing. Both run under one
        # write lock; with nothing stale and nothing new no version is written.
        self._require_writable()
        rows = list(transitions)
        wanted: dict[str, tuple[Any, ...]] = {}
        for t in rows:
            wanted.setdefault(t.id, _stored_values(t))
        with self._write_lock():
            stored = self._scan(RESULT_COLUMNS)
            stale = [
                row["id"]
                for row in stored.to_pylist()
                if wanted.get(row["id"]) != tuple(row[c] for c in RESULT_COLUMNS)
            ]
            if stale:
                with self._io("delete stale rows"):
                    for i in range(0, len(stale), 1000):
                        chunk = stale[i : i + 1000]
                        self._table.delete("id IN (" + ", ".join(map(sql_literal, chunk)) + ")")
                self._changed()
            result = self.add(rows, embeddings=embeddings)
            if stale and not result.changed:
                self._maintain_index()  # add wrote nothing, so it did not maintain it
        return result, len(stale)

    def evict_synthetic(self, cap: int | None = None, policy: Eviction | None = None) -> int:
        """Evict synthetic rows above ``cap`` with ``policy`` (config defaults); returns count."""
        self._require_writable()
        cap = self.cfg.synthetic_cap if cap is None else cap
        if cap < 0:
            raise ValueError("cap must be >= 0")
        policy = policy or self.cfg.eviction
        synth = self._scan(["iteration", "rkey"], "source = 'synthetic'")
        empty = np.zeros(0, dtype=np.int64)
        plan = plan_eviction(
            cap, policy, synth["iteration"].to_numpy(), synth["rkey"].to_numpy(), empty, empty
        )
        if plan.delete_where is None:
            return 0
        with self._io("evict"):
            self._table.delete(plan.delete_where)
        self._changed()
        self._maintain_index()
        return plan.n_delete


def _stored_values(t: Transition) -> tuple[Any, ...]:
    """``t`` as the table stores it: the ``RESULT_COLUMNS`` values, in order."""
    flat = {
        **t.model_dump(exclude={"provenance"}),
        **t.provenance.model_dump(),
    }
    return tuple(flat[c] for c in RESULT_COLUMNS)
