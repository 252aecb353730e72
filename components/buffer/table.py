"""One open buffer table: its state, schema checks, I/O errors, scans and the write lock.

``BufferTable`` is the base that the store's parts (writes, index, versions, retrieval)
extend; ``components.buffer.store.ReplayBuffer`` composes them.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.buffer.embedders import Embedder, make_embedder, normalize_rows
from components.buffer.errors import (
    BufferCorruptedError,
    BufferReadOnlyError,
    EmbedderMismatchError,
    ReplayBufferError,
    first_line,
)
from components.buffer.retrieval_stats import RetrievalStats
from components.buffer.schema import (
    LOCK_FILE,
    META_DIM,
    META_EMBEDDER,
    RESULT_COLUMNS,
    TABLE_DIR,
    VECTOR_COLUMN,
    VECTOR_INDEX_PREFIX,
    check_schema,
    row_to_transition,
    vectors,
)
from components.config import BufferConfig

EMBED_CACHE_TEXTS = 32_768  # texts a handle keeps the vectors of (~50 MB at 384-d)


class BufferTable:
    """A handle on the LanceDB table of one buffer (the state every part shares)."""

    def __init__(
        self,
        table: Any,
        path: Path,
        cfg: BufferConfig,
        embedder: Embedder | None,
        *,
        latency_window: int = 10_000,
    ) -> None:
        self._table = table
        self.path = path
        self.cfg = cfg
        self._embedder = embedder
        self._pinned: int | None = None
        self._lock_depth = 0
        self._index: tuple[str, int] | None = None
        self._index_known = False
        self._prewarmed = False
        self._retrievals = RetrievalStats(latency_window)
        self._vectors: dict[str, np.ndarray] = {}  # text -> unit vector (_embed_unique)

    @property
    def table_dir(self) -> Path:
        """The ``transitions.lance`` directory."""
        return self.path / TABLE_DIR

    @property
    def embedder(self) -> Embedder:
        """The embedder used for rows and queries."""
        if self._embedder is None:
            self._embedder = make_embedder(self.cfg)
        return self._embedder

    @property
    def dim(self) -> int:
        """Embedding dimension stored in the table."""
        return int((self._table.schema.metadata or {})[META_DIM])

    @property
    def embedder_name(self) -> str:
        """Embedder identity stored in the table."""
        return (self._table.schema.metadata or {})[META_EMBEDDER].decode()

    @property
    def version(self) -> int:
        """Current table version (the checked-out one when read-only)."""
        return int(self._table.version)

    @property
    def read_only(self) -> bool:
        """True while a historical version is checked out."""
        return self._pinned is not None

    def __len__(self) -> int:
        with self._io("count"):
            return int(self._table.count_rows())

    def _check_schema(self) -> None:
        where = str(self.table_dir)
        dim, stored_embedder = check_schema(self._table.schema, where)
        emb = self.embedder
        if stored_embedder != emb.name:
            raise EmbedderMismatchError(
                f"{where} was embedded with {stored_embedder!r} ({dim}-d) but the configured "
                f"embedder is {emb.name!r}: rebuild the buffer or set buffer.embedder to match"
            )

    def _check_embedder_dim(self, vecs: np.ndarray) -> None:
        if vecs.ndim != 2 or vecs.shape[1] != self.dim:
            raise EmbedderMismatchError(
                f"{self.table_dir} stores {self.dim}-d embeddings but got vectors of shape "
                f"{vecs.shape} from {self.embedder.name!r}"
            )

    def _embed_unique(self, texts: list[str]) -> np.ndarray:
        # episodes revisit the same (task, state, action) often, within a batch and across
        # a DreamGym run's rounds (~90% of a run's texts came before): embed each text once
        cache = self._vectors
        # the batch's vectors are kept here: a clear below must not drop those already cached
        found = {t: cache[t] for t in dict.fromkeys(texts) if t in cache}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            vecs = normalize_rows(self.embedder.embed(missing))
            self._check_embedder_dim(vecs)
            if len(cache) + len(missing) > EMBED_CACHE_TEXTS:
                cache.clear()  # rare; bounded memory matters more than hits
            cache.update(zip(missing, vecs, strict=True))
            found.update(zip(missing, vecs, strict=True))
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[t] for t in texts])

    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Turn storage-level failures into a BufferCorruptedError naming the table."""
        try:
            yield
        except ReplayBufferError:
            raise
        except (RuntimeError, OSError) as err:
            raise BufferCorruptedError(
                f"{what} failed on {self.table_dir} (corrupted or missing files?): "
                f"{first_line(err)}"
            ) from err

    def _scan(self, columns: list[str], where: str | None = None) -> pa.Table:
        with self._io("scan"):
            q = self._table.search().select(columns).limit(None)
            if where:
                q = q.where(where)
            return q.to_arrow()

    def _verify_light(self) -> None:
        keys = self._scan(["id", "source", "seq"])
        with self._io("count"):
            n = int(self._table.count_rows())
        self._check_keys(keys, n)

    def _check_keys(self, keys: pa.Table, n: int) -> None:
        where = str(self.table_dir)
        if keys.num_rows != n:
            raise BufferCorruptedError(f"{where}: {n} rows counted but {keys.num_rows} read")
        if keys["id"].null_count:
            raise BufferCorruptedError(f"{where}: {keys['id'].null_count} rows without id")
        distinct = pc.count_distinct(keys["id"]).as_py()
        if distinct != n:
            raise BufferCorruptedError(f"{where}: {n - distinct} duplicate transition ids")
        bad = set(pc.unique(keys["source"]).to_pylist()) - {"real", "synthetic"}
        if bad:
            raise BufferCorruptedError(f"{where}: invalid source values {sorted(map(str, bad))}")

    def verify(self) -> dict[str, int]:
        """Full scan: every column readable, ids unique, vectors finite and unit, rows valid."""
        n = len(self)
        self._check_keys(self._scan(["id", "source", "seq"]), n)
        checked = 0
        with self._io("verify"):
            reader = self._table.search().limit(None).to_batches(4096)
            for batch in reader:
                tbl = pa.Table.from_batches([batch])
                vecs = vectors(tbl[VECTOR_COLUMN], self.dim)
                norms = np.linalg.norm(vecs, axis=1)
                if not np.all(np.isfinite(vecs)) or np.any(np.abs(norms - 1) > 1e-3):
                    raise BufferCorruptedError(
                        f"{self.table_dir}: non-finite or non-unit embeddings near row {checked}"
                    )
                for row in tbl.select(RESULT_COLUMNS).to_pylist():
                    row_to_transition(row, self.table_dir)
                checked += tbl.num_rows
        return {"rows": checked, "version": self.version}

    def _checkout_latest(self) -> None:
        with self._io("checkout latest"):
            self._table.checkout_latest()
        self._pinned = None
        self._changed()

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        """Serialise writers of this buffer across processes, on its latest version."""
        # add() reads which ids exist, then inserts the others: two processes doing that
        # from their own snapshots both insert the same new ids (measured: duplicate rows;
        # lance does not check insert-only merges against each other). An flock on a
        # sibling file makes the read-check-write atomic on a local filesystem; object
        # stores need LanceDB's commit store instead.
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        with (self.path / LOCK_FILE).open("a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            self._lock_depth = 1
            try:
                if self._pinned is None:
                    self._checkout_latest()  # see what the previous lock holder committed
                yield
            finally:
                self._lock_depth = 0
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _require_writable(self) -> None:
        if self._pinned is not None:
            raise BufferReadOnlyError(
                f"{self.table_dir} is checked out at version {self._pinned} (read-only); "
                "call checkout_latest() before writing"
            )

    def _vector_index(self) -> tuple[str, int] | None:
        # cached: looked up once per table state (writes and checkouts reset it)
        if not self._index_known:
            self._index = None
            with self._io("list indices"):
                for idx in self._table.list_indices():
                    if idx.name.startswith(VECTOR_INDEX_PREFIX):
                        self._index = idx.name, int(idx.name[len(VECTOR_INDEX_PREFIX) :])
            self._index_known = True
        return self._index

    def _changed(self) -> None:
        self._index_known = False
        self._prewarmed = False
