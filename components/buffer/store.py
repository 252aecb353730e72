"""The co-evolving replay buffer: one versioned LanceDB table of transitions.

Layout: ``<buffer_dir>/transitions.lance`` holds every transition (the ``Transition``
fields, flattened provenance, an insertion counter, a reservoir key and an
``embedding`` column of unit vectors). The embedder's identity and dimension live in the
table's schema metadata, so a buffer is never queried with incomparable vectors.

Semantics
- ``add`` is idempotent: rows merge on the deterministic transition id, existing rows
  win, and a batch with nothing new writes nothing (no new table version).
- Co-evolution cap: real rows are never evicted. Synthetic rows above
  ``buffer.synthetic_cap`` are evicted by ``buffer.eviction``:
  ``oldest`` drops rows of the lowest ``provenance.iteration`` first (inside one iteration
  a hash-of-id key breaks ties, so the outcome never depends on arrival order);
  ``reservoir`` keeps the ``cap`` synthetic rows with the smallest hash-of-id key (a
  bottom-k sketch: a uniform, deterministic sample of every synthetic row ever offered).
  Incoming rows the policy would evict at once are never written, so re-adding them is a
  no-op too; the kept set is a function of the set of rows offered, not of their order.
- Retrieval: cosine distance on ``embed_text(task, state, action)``; exact (flat) search
  below ``buffer.index_min_rows`` rows, an IVF_FLAT index from there on (sqrt(N)
  partitions, 20% and at least 36 probed: recall@10 >= 0.95 vs exact in
  ``bench/buffer.py``); a filter that leaves fewer than k matches in the probed
  partitions makes the search probe on until k are found.
  A ``Transition`` query never retrieves rows of its own episode (leakage).
- Versions: every write is a table version; ``tag`` names one (e.g. per iteration) and
  ``checkout`` gives a read-only view of it, so an experiment can be replayed against the
  buffer it saw. Old versions are never pruned here.
- Failure: a corrupted table or a schema/embedder mismatch raises a ``ReplayBufferError``
  subclass naming the path and the problem; nothing is ever recreated over existing data.
  The one exception holds no data: a table folder left by a first build killed before its
  first version (no manifest, no data file) is removed and created again, with a warning.

Concurrency: writers in several processes are serialised by an flock on
``<buffer_dir>/transitions.lance.lock`` (local filesystems), and each write starts from
the latest version, so concurrent ``add`` calls lose nothing and never duplicate an id.
Never ``fork`` a process after using LanceDB (use spawn); a reading handle sees other
processes' commits only after ``refresh()``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import shutil
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.index import Bitmap, BTree, IvfFlat
from pydantic import ValidationError

from components.buffer.embedders import Embedder, embed_text, make_embedder, normalize_rows
from components.config import BufferConfig
from components.schema import Provenance, Source, Transition

TABLE_NAME = "transitions"
LOCK_FILE = f"{TABLE_NAME}.lance.lock"  # next to the table: serialises writing processes
SCHEMA_VERSION = "1"
META_SCHEMA_VERSION = b"dreamgym.buffer.schema_version"
META_EMBEDDER = b"dreamgym.buffer.embedder"
META_DIM = b"dreamgym.buffer.dim"
VECTOR_COLUMN = "embedding"
VECTOR_INDEX_PREFIX = "embedding_ivf_flat_p"  # the partition count is encoded in the name
SCALAR_INDEXES = (("env", "bitmap"), ("source", "bitmap"), ("episode_id", "btree"))
# Versions are the buffer's history (tags pin experiments): optimize() must never prune.
_KEEP_VERSIONS = timedelta(days=36500)
_MAX_FRAGMENTS_UNINDEXED = 64
NPROBES_FRACTION = 0.2
NPROBES_MIN = 36
Eviction = Literal["oldest", "reservoir"]
log = logging.getLogger(__name__)


class ReplayBufferError(RuntimeError):
    """Base class of every replay-buffer failure."""


class BufferNotFoundError(ReplayBufferError):
    """No buffer table at the given path (and creation was not requested)."""


class BufferCorruptedError(ReplayBufferError):
    """The table exists but cannot be read: missing or damaged files, broken invariants."""


class BufferSchemaError(ReplayBufferError):
    """The table's columns or schema version differ from what this code reads."""


class EmbedderMismatchError(BufferSchemaError):
    """The table was embedded with another model or dimension than the configured one."""


class BufferReadOnlyError(ReplayBufferError):
    """A write was attempted on a checked-out (historical) version."""


class BufferVersionError(ReplayBufferError):
    """Unknown version/tag, an invalid tag name, or a tag that already points elsewhere."""


def table_schema(dim: int, embedder_name: str) -> pa.Schema:
    """The Arrow schema of the buffer table for an embedding dimension."""
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("env", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("step_index", pa.int32(), nullable=False),
        pa.field("instruction", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("next_state", pa.string(), nullable=False),
        pa.field("reward", pa.int8(), nullable=False),
        pa.field("done", pa.bool_(), nullable=False),
        pa.field("admissible_actions", pa.list_(pa.string())),
        pa.field("valid_action", pa.bool_(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("checkpoint", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("seq", pa.int64(), nullable=False),  # insertion order
        pa.field("rkey", pa.int64(), nullable=False),  # hash-of-id key (eviction order)
        pa.field(VECTOR_COLUMN, pa.list_(pa.float32(), dim), nullable=False),
    ]
    meta = {
        META_SCHEMA_VERSION: SCHEMA_VERSION.encode(),
        META_EMBEDDER: embedder_name.encode(),
        META_DIM: str(dim).encode(),
    }
    return pa.schema(fields, metadata=meta)


RESULT_COLUMNS = [
    f.name for f in table_schema(1, "x") if f.name not in ("seq", "rkey", VECTOR_COLUMN)
]


def reservoir_key(transition_id: str) -> int:
    """Deterministic pseudo-random 63-bit key of a transition id (eviction order)."""
    digest = hashlib.sha256(b"dreamgym-reservoir\x1f" + transition_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def ivf_partitions(rows: int) -> int:
    """IVF partitions for a table size: about sqrt(rows), clamped to [16, 1024]."""
    return int(min(1024, max(16, round(math.sqrt(max(rows, 1))))))


def ivf_nprobes(partitions: int) -> int:
    """Partitions probed per query: 20% and at least 36 (bench: recall@10 >= 0.95)."""
    # Measured on 384-d clustered data: ~35 probes reach recall 0.97 at 10K-50K rows,
    # 100K rows needs ~20% of sqrt(N) partitions; 10% lost recall (0.89 at 10K rows).
    return min(partitions, max(NPROBES_MIN, math.ceil(NPROBES_FRACTION * partitions)))


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:400] if text else type(err).__name__


def filter_sql(
    env: str | None = None, exclude_episode: str | None = None, source: Source | None = None
) -> str | None:
    """The SQL predicate for retrieval filters (None = no filter)."""
    parts = []
    if env is not None:
        parts.append(f"env = {_sql(env)}")
    if exclude_episode is not None:
        parts.append(f"episode_id != {_sql(exclude_episode)}")
    if source is not None:
        if source not in ("real", "synthetic"):
            raise ValueError(f"source must be 'real', 'synthetic' or None, got {source!r}")
        parts.append(f"source = {_sql(source)}")
    return " AND ".join(parts) or None


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


@dataclass(frozen=True)
class _EvictionPlan:
    reject_new: frozenset[int]  # positions (in the new-row arrays) never to insert
    delete_where: str | None  # predicate removing existing synthetic rows
    n_delete: int


def plan_eviction(
    cap: int,
    policy: Eviction,
    old_iteration: np.ndarray,
    old_rkey: np.ndarray,
    new_iteration: np.ndarray,
    new_rkey: np.ndarray,
) -> _EvictionPlan:
    """Decide which synthetic rows (existing and incoming) the cap removes."""
    n_old, n_new = len(old_rkey), len(new_rkey)
    if n_old + n_new <= cap:
        return _EvictionPlan(frozenset(), None, 0)
    if cap == 0:
        where = "source = 'synthetic'" if n_old else None
        return _EvictionPlan(frozenset(range(n_new)), where, n_old)
    is_new = np.concatenate([np.zeros(n_old, bool), np.ones(n_new, bool)])
    pos = np.concatenate([np.arange(n_old), np.arange(n_new)])
    key = np.concatenate([old_rkey, new_rkey]).astype(np.int64)
    if policy == "oldest":
        # Age = co-evolution iteration; inside one iteration the hash key breaks ties, so
        # the kept set depends only on which rows were offered, never on arrival order.
        it = np.concatenate([old_iteration, new_iteration]).astype(np.int64)
        order = np.lexsort((key, it))  # oldest first
        drop = order[: len(order) - cap]
        last = drop[-1]  # the youngest dropped row: everything at or below it goes
        i_t, k_t = int(it[last]), int(key[last])
        where = (
            f"source = 'synthetic' AND (iteration < {i_t} OR (iteration = {i_t} AND rkey <= {k_t}))"
        )
    elif policy == "reservoir":
        order = np.argsort(key, kind="stable")  # keep the smallest keys
        drop = order[cap:]
        threshold = int(key[order[cap - 1]])
        where = f"source = 'synthetic' AND rkey > {threshold}"
    else:
        raise ValueError(f"unknown eviction policy {policy!r}")
    reject = frozenset(int(pos[i]) for i in drop if is_new[i])
    n_delete = int(np.count_nonzero(~is_new[drop]))
    return _EvictionPlan(reject, where if n_delete else None, n_delete)


class ReplayBuffer:
    """A LanceDB-backed, versioned replay buffer of real and synthetic transitions."""

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
        self._latencies: deque[float] = deque(maxlen=latency_window)
        self._rstats: Counter[str] = Counter()
        self._rsums: dict[str, float] = {"top1_distance": 0.0, "distance": 0.0}

    # ---------------------------------------------------------------- open / create

    @classmethod
    def open(
        cls,
        path: str | Path,
        cfg: BufferConfig | None = None,
        *,
        embedder: Embedder | None = None,
        create: bool = True,
        version: int | str | None = None,
        verify: bool = True,
    ) -> ReplayBuffer:
        """Open the buffer at ``path`` (creating an empty one if allowed); checks the schema."""
        path = Path(path)
        cfg = cfg or BufferConfig()
        emb = embedder or make_embedder(cfg)
        table_dir = path / f"{TABLE_NAME}.lance"
        if interrupted_first_build(table_dir) and not (create and version is None):
            raise BufferCorruptedError(
                f"{table_dir} holds no table version: its first build was interrupted; "
                "rerun `dreamgym build-buffer` to rebuild it"
            )
        if not table_dir.exists() or interrupted_first_build(table_dir):
            if not create or version is not None:
                raise BufferNotFoundError(f"no replay buffer at {table_dir}")
            path.mkdir(parents=True, exist_ok=True)
            table = _create_table(path, table_dir, table_schema(emb.dim, emb.name))
        else:
            db = lancedb.connect(str(path))
            try:
                table = db.open_table(TABLE_NAME)
            except ValueError as err:  # lancedb's "not found": the manifests are gone
                raise BufferCorruptedError(
                    f"{table_dir} exists but holds no readable table version "
                    f"(_versions/ manifests missing?): {_first_line(err)}"
                ) from err
            except (RuntimeError, OSError) as err:
                raise BufferCorruptedError(
                    f"{table_dir} cannot be opened (corrupted manifest?): {_first_line(err)}"
                ) from err
        buf = cls(table, path, cfg, emb)
        buf._check_schema()
        if version is not None:
            buf.checkout(version)
        if verify:
            buf._verify_light()
        return buf

    @property
    def table_dir(self) -> Path:
        """The ``transitions.lance`` directory."""
        return self.path / f"{TABLE_NAME}.lance"

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
        schema = self._table.schema
        meta = schema.metadata or {}
        where = str(self.table_dir)
        if META_SCHEMA_VERSION not in meta:
            raise BufferSchemaError(
                f"{where}: not a DreamGym replay buffer (no {META_SCHEMA_VERSION.decode()} "
                "in the schema metadata)"
            )
        found = meta[META_SCHEMA_VERSION].decode()
        if found != SCHEMA_VERSION:
            raise BufferSchemaError(
                f"{where}: buffer schema version {found}, this code reads {SCHEMA_VERSION}; "
                "rebuild the buffer (build_buffer)"
            )
        try:
            dim = int(meta[META_DIM])
            stored_embedder = meta[META_EMBEDDER].decode()
        except (KeyError, ValueError) as err:
            raise BufferSchemaError(f"{where}: embedder metadata missing or invalid") from err
        expected = table_schema(dim, stored_embedder)
        problems = []
        missing = [f.name for f in expected if f.name not in schema.names]
        extra = [n for n in schema.names if n not in expected.names]
        if missing:
            problems.append(f"missing columns {missing}")
        if extra:
            problems.append(f"unexpected columns {extra}")
        for f in expected:
            if f.name in schema.names and schema.field(f.name).type != f.type:
                problems.append(
                    f"column {f.name!r} has type {schema.field(f.name).type}, expected {f.type}"
                )
        if problems:
            raise BufferSchemaError(f"{where}: schema mismatch: " + "; ".join(problems))
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
                f"{_first_line(err)}"
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
                vecs = _vectors(tbl[VECTOR_COLUMN], self.dim)
                norms = np.linalg.norm(vecs, axis=1)
                if not np.all(np.isfinite(vecs)) or np.any(np.abs(norms - 1) > 1e-3):
                    raise BufferCorruptedError(
                        f"{self.table_dir}: non-finite or non-unit embeddings near row {checked}"
                    )
                for row in tbl.select(RESULT_COLUMNS).to_pylist():
                    self._to_transition(row)
                checked += tbl.num_rows
        return {"rows": checked, "version": self.version}

    # ---------------------------------------------------------------- writes

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
                    self.checkout_latest()  # see what the previous lock holder committed
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
        plan = _EvictionPlan(frozenset(), None, 0)
        if evict and new:
            plan = self._plan(existing, [rows[i] for i in new], rkeys)
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
                data = self._to_arrow(batch, vecs, seqs[keep], rkeys[keep])
                self._table.merge_insert("id").when_not_matched_insert_all().execute(data)
            if plan.delete_where is not None:
                self._table.delete(plan.delete_where)
        self._changed()
        self._maintain_index()
        t2 = time.perf_counter()
        result.update(embed_seconds=t1 - t0, write_seconds=t2 - t1)
        return AddResult(inserted=len(batch), evicted=plan.n_delete, version=self.version, **result)

    def _embed_unique(self, texts: list[str]) -> np.ndarray:
        # episodes revisit the same (task, state, action) often: embed each text once
        unique = list(dict.fromkeys(texts))
        vecs = normalize_rows(self.embedder.embed(unique))
        self._check_embedder_dim(vecs)
        if len(unique) == len(texts):
            return vecs
        where = {text: i for i, text in enumerate(unique)}
        return vecs[[where[text] for text in texts]]

    def _plan(
        self, existing: pa.Table, new_rows: list[Transition], rkeys: np.ndarray
    ) -> _EvictionPlan:
        synth = existing.filter(pc.equal(existing["source"], "synthetic"))
        is_syn = np.array([t.source == "synthetic" for t in new_rows], dtype=bool)
        if not is_syn.any() and synth.num_rows <= self.cfg.synthetic_cap:
            return _EvictionPlan(frozenset(), None, 0)
        syn_pos = np.flatnonzero(is_syn)
        plan = plan_eviction(
            self.cfg.synthetic_cap,
            self.cfg.eviction,
            synth["iteration"].to_numpy(),
            synth["rkey"].to_numpy(),
            np.array([new_rows[i].provenance.iteration for i in syn_pos], dtype=np.int64),
            rkeys[syn_pos],
        )
        # map positions among the synthetic newcomers back to positions among all newcomers
        reject = frozenset(int(syn_pos[j]) for j in plan.reject_new)
        return _EvictionPlan(reject, plan.delete_where, plan.n_delete)

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

    def _to_arrow(
        self, rows: list[Transition], vecs: np.ndarray, seqs: np.ndarray, rkeys: np.ndarray
    ) -> pa.Table:
        schema = self._table.schema
        cols: dict[str, Any] = {
            "id": [t.id for t in rows],
            "task_id": [t.task_id for t in rows],
            "env": [t.env for t in rows],
            "episode_id": [t.episode_id for t in rows],
            "step_index": [t.step_index for t in rows],
            "instruction": [t.instruction for t in rows],
            "state": [t.state for t in rows],
            "action": [t.action for t in rows],
            "next_state": [t.next_state for t in rows],
            "reward": [t.reward for t in rows],
            "done": [t.done for t in rows],
            "admissible_actions": [t.admissible_actions for t in rows],
            "valid_action": [t.valid_action for t in rows],
            "source": [t.source for t in rows],
            "policy": [t.provenance.policy for t in rows],
            "iteration": [t.provenance.iteration for t in rows],
            "checkpoint": [t.provenance.checkpoint for t in rows],
            "seed": [t.provenance.seed for t in rows],
            "seq": seqs,
            "rkey": rkeys,
            VECTOR_COLUMN: pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(vecs, dtype=np.float32).ravel()), self.dim
            ),
        }
        return pa.table(cols, schema=schema)

    # ---------------------------------------------------------------- index

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

    def build_index(self) -> int:
        """(Re)build the IVF_FLAT vector index and the filter indexes; returns partitions."""
        self._require_writable()
        rows = len(self)
        if rows < 256:
            raise ValueError(f"an IVF index needs at least 256 rows, the buffer has {rows}")
        partitions = ivf_partitions(rows)
        name = f"{VECTOR_INDEX_PREFIX}{partitions}"
        old = self._vector_index()
        self.optimize()  # one compacted fragment first: cheaper row fetches after search
        with self._io("create index"):
            if old is not None and old[0] != name:
                self._table.drop_index(old[0])
            self._table.create_index(
                VECTOR_COLUMN,
                config=IvfFlat(distance_type="cosine", num_partitions=partitions),
                name=name,
                replace=True,
            )
            # scalar indexes keep prefiltered queries (env, episode, source) fast
            for column, kind in SCALAR_INDEXES:
                config = Bitmap() if kind == "bitmap" else BTree()
                self._table.create_index(column, config=config, name=f"{column}_idx", replace=True)
        self._changed()
        return partitions

    def optimize(self) -> None:
        """Compact small files and fold new rows into the indexes (never prunes versions)."""
        self._require_writable()
        with self._io("optimize"):
            self._table.optimize(cleanup_older_than=_KEEP_VERSIONS)
        self._changed()

    def _maintain_index(self) -> None:
        rows = len(self)
        idx = self._vector_index()
        if idx is None:
            if rows >= self.cfg.index_min_rows:
                self.build_index()
            elif self._fragments() > _MAX_FRAGMENTS_UNINDEXED:
                self.optimize()  # many small appends slow a flat scan down
            return
        name, partitions = idx
        if ivf_partitions(rows) >= 2 * partitions:
            self.build_index()  # the table grew ~4x since training: retrain the centroids
            return
        with self._io("index stats"):
            st = self._table.index_stats(name)
        if st is not None and st.num_unindexed_rows > max(1000, 0.1 * st.num_indexed_rows):
            self.optimize()

    def _fragments(self) -> int:
        with self._io("stats"):
            return int(self._table.stats()["fragment_stats"]["num_fragments"])

    # ---------------------------------------------------------------- retrieval

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
        rows = self._query(vec, k, where, idx, exact, unbounded=False)
        if where and idx is not None and not exact and len(rows) < k:
            # a selective filter can leave the probed partitions short of k matches:
            # keep probing until k are found (or the table is exhausted)
            rows = self._query(vec, k, where, idx, exact, unbounded=True)
        hits = [(self._to_transition(r), float(r["_distance"])) for r in rows]
        self._record(time.perf_counter() - start, hits, k)
        return hits

    def _query(
        self,
        vec: np.ndarray,
        k: int,
        where: str | None,
        idx: tuple[str, int] | None,
        exact: bool,
        *,
        unbounded: bool,
    ) -> list[dict[str, Any]]:
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

    def _to_transition(self, row: dict[str, Any]) -> Transition:
        try:
            return Transition(
                id=row["id"],
                task_id=row["task_id"],
                env=row["env"],
                episode_id=row["episode_id"],
                step_index=row["step_index"],
                instruction=row["instruction"],
                state=row["state"],
                action=row["action"],
                next_state=row["next_state"],
                reward=row["reward"],
                done=row["done"],
                admissible_actions=row["admissible_actions"],
                valid_action=row["valid_action"],
                source=row["source"],
                provenance=Provenance(
                    policy=row["policy"],
                    iteration=row["iteration"],
                    checkpoint=row["checkpoint"],
                    seed=row["seed"],
                ),
            )
        except ValidationError as err:
            raise BufferCorruptedError(
                f"{self.table_dir}: row {row.get('id')!r} is not a valid Transition: {err}"
            ) from err

    def _record(self, seconds: float, hits: list[tuple[Transition, float]], k: int) -> None:
        self._latencies.append(seconds)
        self._rstats["queries"] += 1
        self._rstats["results"] += len(hits)
        self._rstats["real_results"] += sum(t.source == "real" for t, _ in hits)
        if len(hits) < k:
            self._rstats["short_queries"] += 1
        if hits:
            self._rsums["top1_distance"] += hits[0][1]
            self._rsums["distance"] += sum(d for _, d in hits)

    def retrieval_stats(self, reset: bool = False) -> dict[str, float]:
        """Latency and result statistics of the retrievals made through this handle."""
        n = self._rstats["queries"]
        results = self._rstats["results"]
        lat = np.array(self._latencies) * 1000 if self._latencies else np.zeros(1)
        out = {
            "retrieval_queries": float(n),
            "retrieval_p50_ms": float(np.percentile(lat, 50)),
            "retrieval_p99_ms": float(np.percentile(lat, 99)),
            "retrieval_mean_top1_distance": self._rsums["top1_distance"] / max(n, 1),
            "retrieval_mean_distance": self._rsums["distance"] / max(results, 1),
            "retrieval_frac_real": self._rstats["real_results"] / max(results, 1),
            "retrieval_frac_short": self._rstats["short_queries"] / max(n, 1),
        }
        if reset:
            self._latencies.clear()
            self._rstats.clear()
            self._rsums = {"top1_distance": 0.0, "distance": 0.0}
        return out

    # ---------------------------------------------------------------- reads

    def get(self, ids: Sequence[str]) -> list[Transition]:
        """The stored transitions with these ids (missing ids are skipped), in id order given."""
        if not ids:
            return []
        found: dict[str, Transition] = {}
        for i in range(0, len(ids), 1000):
            chunk = ids[i : i + 1000]
            where = "id IN (" + ", ".join(_sql(x) for x in chunk) + ")"
            for row in self._scan(RESULT_COLUMNS, where).to_pylist():
                found[row["id"]] = self._to_transition(row)
        return [found[x] for x in ids if x in found]

    def transitions(
        self, *, env: str | None = None, source: Source | None = None
    ) -> list[Transition]:
        """Every stored transition matching the filters, in insertion order."""
        tbl = self._scan([*RESULT_COLUMNS, "seq"], filter_sql(env, None, source))
        tbl = tbl.sort_by("seq")
        return [self._to_transition(r) for r in tbl.select(RESULT_COLUMNS).to_pylist()]

    def to_arrow(self, *, with_embeddings: bool = False) -> pa.Table:
        """The whole table as Arrow (for drift reports / exports), embeddings optional."""
        cols = [*RESULT_COLUMNS, "seq"] + ([VECTOR_COLUMN] if with_embeddings else [])
        return self._scan(cols).sort_by("seq")

    def stats(self) -> dict[str, Any]:
        """Sizes, provenance breakdown, version and index state (plain data for MLflow)."""
        keys = self._scan(["source", "env", "iteration"])
        sources = Counter(keys["source"].to_pylist())
        synth_iters = Counter(
            keys.filter(pc.equal(keys["source"], "synthetic"))["iteration"].to_pylist()
        )
        idx = self._vector_index()
        unindexed = keys.num_rows
        if idx is not None:
            with self._io("index stats"):
                st = self._table.index_stats(idx[0])
            unindexed = st.num_unindexed_rows if st is not None else unindexed
        return {
            "rows": keys.num_rows,
            "rows_real": sources.get("real", 0),
            "rows_synthetic": sources.get("synthetic", 0),
            "rows_by_env": dict(Counter(keys["env"].to_pylist())),
            "synthetic_rows_by_iteration": {int(k): v for k, v in sorted(synth_iters.items())},
            "version": self.version,
            "read_only": self.read_only,
            "tags": len(self.tags()),
            "embedder": self.embedder_name,
            "dim": self.dim,
            "indexed": idx is not None,
            "index_partitions": idx[1] if idx else 0,
            "unindexed_rows": unindexed,
            "synthetic_cap": self.cfg.synthetic_cap,
            "eviction": self.cfg.eviction,
        }

    def metrics(self) -> dict[str, float]:
        """Numeric sizes, index state and retrieval stats, flat (ready for MLflow metrics)."""
        st = self.stats()
        out = {
            key: float(st[key])
            for key in ("rows", "rows_real", "rows_synthetic", "version", "unindexed_rows")
        }
        out["index_partitions"] = float(st["index_partitions"])
        out.update({f"rows_env_{env}": float(n) for env, n in st["rows_by_env"].items()})
        return {**out, **self.retrieval_stats()}

    # ---------------------------------------------------------------- versions

    def tag(self, name: str, *, overwrite: bool = False) -> int:
        """Name the current version (e.g. ``iter-3``); re-tagging the same version is a no-op."""
        self._require_writable()
        version = self.version
        tags = self.tags()
        with self._io("tag"):
            try:
                if name in tags:
                    if tags[name] == version:
                        return version
                    if not overwrite:
                        raise BufferVersionError(
                            f"tag {name!r} already points to version {tags[name]} "
                            f"(current is {version}); pass overwrite=True to move it"
                        )
                    self._table.tags.update(name, version)
                else:
                    self._table.tags.create(name, version)
            except RuntimeError as err:
                if "Ref" in str(err):
                    raise BufferVersionError(f"invalid tag {name!r}: {_first_line(err)}") from err
                raise
        return version

    def tags(self) -> dict[str, int]:
        """Tag name -> version."""
        with self._io("list tags"):
            return {k: int(v["version"]) for k, v in self._table.tags.list().items()}

    def versions(self) -> list[dict[str, Any]]:
        """Every version with its timestamp, row count and tags (oldest first)."""
        by_version: dict[int, list[str]] = {}
        for name, v in self.tags().items():
            by_version.setdefault(v, []).append(name)
        with self._io("list versions"):
            listed = self._table.list_versions()
        return [
            {
                "version": int(v["version"]),
                "timestamp": v["timestamp"].isoformat(),
                "rows": int(v.get("metadata", {}).get("total_rows", -1)),
                "tags": sorted(by_version.get(int(v["version"]), [])),
            }
            for v in listed
        ]

    def _resolve(self, ref: int | str) -> int:
        if isinstance(ref, int):
            return ref
        tags = self.tags()
        if ref not in tags:
            raise BufferVersionError(f"{self.table_dir}: unknown tag {ref!r}; tags: {sorted(tags)}")
        return tags[ref]

    def checkout(self, ref: int | str) -> None:
        """Read-only view of a version or tag (writes raise until ``checkout_latest``)."""
        version = self._resolve(ref)
        try:
            self._table.checkout(version)
        except ValueError as err:
            raise BufferVersionError(
                f"{self.table_dir}: version {ref!r} does not exist: {_first_line(err)}"
            ) from err
        self._pinned = version
        self._changed()
        self._check_schema()

    def checkout_latest(self) -> None:
        """Back to the newest version (also picks up other processes' commits)."""
        with self._io("checkout latest"):
            self._table.checkout_latest()
        self._pinned = None
        self._changed()

    def refresh(self) -> None:
        """See commits made by other processes (no-op on a checked-out view)."""
        if self._pinned is None:
            self.checkout_latest()

    def restore(self, ref: int | str) -> int:
        """Make an old version (or tag) the newest one again; history is kept. Returns it."""
        version = self._resolve(ref)
        self.checkout_latest()
        with self._write_lock(), self._io("restore"):
            try:
                self._table.restore(version)
            except ValueError as err:
                raise BufferVersionError(
                    f"{self.table_dir}: version {ref!r} does not exist: {_first_line(err)}"
                ) from err
        self._changed()
        return self.version


def interrupted_first_build(table_dir: Path) -> bool:
    """True for a table folder killed before its first version: no manifest, no data file."""
    if not table_dir.is_dir():
        return False
    manifests = table_dir / "_versions"
    data = table_dir / "data"
    # a committed version always leaves a manifest; rows only exist in data/ files. With
    # neither there is nothing to keep, and every later open would fail on it.
    return not any(manifests.glob("*.manifest")) and not (data.is_dir() and any(data.iterdir()))


def _create_table(path: Path, table_dir: Path, schema: pa.Schema) -> Any:
    """Create the empty table, or open the one another writer just created."""
    with (path / LOCK_FILE).open("a") as lock:
        # the writers' lock: an interrupted first build is removed by one process only, and
        # never while another one is creating the table
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if interrupted_first_build(table_dir):
            log.warning(
                "%s: the first build of this buffer was interrupted before any version was "
                "written; removing the leftover folder and building it again",
                table_dir,
            )
            shutil.rmtree(table_dir)
        db = lancedb.connect(str(path))
        if table_dir.exists():
            # another writer created it since the check above: use theirs (the schema and
            # embedder checks of open() still apply)
            return db.open_table(TABLE_NAME)
        return db.create_table(TABLE_NAME, schema=schema)


def _vectors(column: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)


def fork_buffer(src: str | Path, dst: str | Path, *, overwrite: bool = False) -> Path:
    """Copy a buffer (all versions and tags) to a new directory, e.g. a stage's own output."""
    src_dir = Path(src) / f"{TABLE_NAME}.lance"
    dst_dir = Path(dst) / f"{TABLE_NAME}.lance"
    if not src_dir.is_dir():
        raise BufferNotFoundError(f"no replay buffer at {src_dir}")
    if dst_dir.exists():
        if not overwrite:
            raise ReplayBufferError(f"{dst_dir} already exists; pass overwrite=True to replace it")
        shutil.rmtree(dst_dir)
    Path(dst).mkdir(parents=True, exist_ok=True)
    shutil.copytree(src_dir, dst_dir)
    return Path(dst)
