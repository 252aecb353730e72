"""The buffer's indexes: an IVF_FLAT vector index from ``buffer.index_min_rows`` rows on,
bitmap/btree indexes for the retrieval filters, and compaction that never prunes versions.
"""

from __future__ import annotations

import math
from datetime import timedelta

from lancedb.index import Bitmap, BTree, IvfFlat

from components.buffer.schema import VECTOR_COLUMN, VECTOR_INDEX_PREFIX
from components.buffer.table import BufferTable

SCALAR_INDEXES = (("env", "bitmap"), ("source", "bitmap"), ("episode_id", "btree"))
# Versions are the buffer's history (tags pin experiments): optimize() must never prune.
_KEEP_VERSIONS = timedelta(days=36500)
_MAX_FRAGMENTS_UNINDEXED = 64


def ivf_partitions(rows: int) -> int:
    """IVF partitions for a table size: about sqrt(rows), clamped to [16, 1024]."""
    return int(min(1024, max(16, round(math.sqrt(max(rows, 1))))))


class IndexMixin(BufferTable):
    """Builds and maintains the vector and filter indexes of the table."""

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
