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

Parts (``ReplayBuffer`` composes them; every name is still importable from here):
``schema`` (columns, metadata, rows <-> Transition), ``table`` (the shared handle: schema
checks, I/O errors, scans, write lock), ``writes`` (``add``, eviction on write),
``eviction`` (the cap's policies), ``index`` (IVF and filter indexes), ``retrieval``
(search), ``retrieval_stats``, ``versions`` (tags, checkouts, restores), ``errors``.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pyarrow.compute as pc

from components.buffer.embedders import Embedder, make_embedder
from components.buffer.errors import (
    BufferCorruptedError,
    BufferNotFoundError,
    ReplayBufferError,
    first_line,
)
from components.buffer.eviction import Eviction, plan_eviction, reservoir_key
from components.buffer.index import SCALAR_INDEXES, ivf_partitions
from components.buffer.retrieval import (
    NPROBES_FRACTION,
    NPROBES_MIN,
    RetrievalMixin,
    filter_sql,
    ivf_nprobes,
    sql_literal,
)
from components.buffer.schema import (
    LOCK_FILE,
    META_DIM,
    META_EMBEDDER,
    META_SCHEMA_VERSION,
    RESULT_COLUMNS,
    SCHEMA_VERSION,
    TABLE_DIR,
    TABLE_NAME,
    VECTOR_COLUMN,
    VECTOR_INDEX_PREFIX,
    row_to_transition,
    table_schema,
)
from components.buffer.versions import VersionsMixin
from components.buffer.writes import AddResult, WritesMixin
from components.config import BufferConfig
from components.io import swap_dir
from components.schema import Source, Transition

# this module's names from before the split into parts: still importable from here (the
# exceptions it does not raise live in components.buffer.errors and the package)
__all__ = [
    "LOCK_FILE",
    "META_DIM",
    "META_EMBEDDER",
    "META_SCHEMA_VERSION",
    "NPROBES_FRACTION",
    "NPROBES_MIN",
    "RESULT_COLUMNS",
    "SCALAR_INDEXES",
    "SCHEMA_VERSION",
    "TABLE_NAME",
    "VECTOR_COLUMN",
    "VECTOR_INDEX_PREFIX",
    "AddResult",
    "BufferCorruptedError",
    "BufferNotFoundError",
    "Eviction",
    "ReplayBuffer",
    "ReplayBufferError",
    "filter_sql",
    "fork_buffer",
    "interrupted_first_build",
    "ivf_nprobes",
    "ivf_partitions",
    "plan_eviction",
    "reservoir_key",
    "table_schema",
]
log = logging.getLogger(__name__)


class ReplayBuffer(WritesMixin, VersionsMixin, RetrievalMixin):
    """A LanceDB-backed, versioned replay buffer of real and synthetic transitions."""

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
        table_dir = path / TABLE_DIR
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
                    f"(_versions/ manifests missing?): {first_line(err)}"
                ) from err
            except (RuntimeError, OSError) as err:
                raise BufferCorruptedError(
                    f"{table_dir} cannot be opened (corrupted manifest?): {first_line(err)}"
                ) from err
        buf = cls(table, path, cfg, emb)
        buf._check_schema()
        if version is not None:
            buf.checkout(version)
        if verify:
            buf._verify_light()
        return buf

    # ---------------------------------------------------------------- reads

    def get(self, ids: Sequence[str]) -> list[Transition]:
        """The stored transitions with these ids (missing ids are skipped), in id order given."""
        if not ids:
            return []
        found: dict[str, Transition] = {}
        for i in range(0, len(ids), 1000):
            chunk = ids[i : i + 1000]
            where = "id IN (" + ", ".join(sql_literal(x) for x in chunk) + ")"
            for row in self._scan(RESULT_COLUMNS, where).to_pylist():
                found[row["id"]] = row_to_transition(row, self.table_dir)
        return [found[x] for x in ids if x in found]

    def transitions(
        self, *, env: str | None = None, source: Source | None = None
    ) -> list[Transition]:
        """Every stored transition matching the filters, in insertion order."""
        tbl = self._scan([*RESULT_COLUMNS, "seq"], filter_sql(env, None, source))
        tbl = tbl.sort_by("seq")
        return [
            row_to_transition(r, self.table_dir) for r in tbl.select(RESULT_COLUMNS).to_pylist()
        ]

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


def fork_buffer(src: str | Path, dst: str | Path, *, overwrite: bool = False) -> Path:
    """Copy a buffer (all versions and tags) to a new directory, e.g. a stage's own output."""
    src_dir = Path(src) / TABLE_DIR
    dst_dir = Path(dst) / TABLE_DIR
    if not src_dir.is_dir():
        raise BufferNotFoundError(f"no replay buffer at {src_dir}")
    if dst_dir.exists() and not overwrite:
        raise ReplayBufferError(f"{dst_dir} already exists; pass overwrite=True to replace it")
    # copied beside it, then swapped in: a kill mid-copy never leaves a partial table
    # there (a resumed run would open it, missing rows or tags); a fixed name, so the next
    # fork removes what a killed one staged
    staged = dst_dir.with_name(f".{TABLE_DIR}.fork")
    shutil.rmtree(staged, ignore_errors=True)
    Path(dst).mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(src_dir, staged)
        swap_dir(staged, dst_dir)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return Path(dst)
