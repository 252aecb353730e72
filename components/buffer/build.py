"""Seed buffer: the ingested real transitions, embedded and stored as version ``seed``.

A rebuild makes the buffer hold exactly its input: rows of transitions that are no
longer ingested (a raw file removed, a line now quarantined) are deleted, so the seed
never trains on data the pipeline dropped. Old versions stay readable.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from components.buffer.embedders import Embedder
from components.buffer.store import ReplayBuffer
from components.config import Config
from components.io import damaged
from components.schema import Trajectory, Transition

SEED_TAG = "seed"
_PROVENANCE_PREFIX = "provenance_"


def _clean(value: Any) -> Any:
    # pandas writes missing optional numbers as NaN floats and lists as arrays
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _from_row(row: dict[str, Any]) -> Transition:
    prov = {
        k[len(_PROVENANCE_PREFIX) :]: _clean(v)
        for k, v in row.items()
        if k.startswith(_PROVENANCE_PREFIX)
    }
    if isinstance(prov.get("seed"), float):
        prov["seed"] = int(prov["seed"])
    data = {
        k: _clean(v)
        for k, v in row.items()
        if not k.startswith(_PROVENANCE_PREFIX) and k in Transition.model_fields
    }
    if "provenance" not in data:
        data["provenance"] = prov
    return Transition.model_validate(data)


def _read_parquet(path: Path, splits: Sequence[str] | None) -> Iterator[Transition]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:  # not parquet, truncated, bad footer
        raise damaged(path, "not a readable parquet file", err) from None
    from pydantic import ValidationError

    for n, row in enumerate(table.to_pylist()):
        if splits is not None and "split" in row and row["split"] not in splits:
            continue
        try:
            yield _from_row(row)
        except ValidationError as err:  # ingest wrote valid rows: this file was changed
            raise damaged(path, f"row {n} is not a transition", err) from None


def _read_jsonl(path: Path, splits: Sequence[str] | None) -> Iterator[Transition]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if isinstance(obj, dict) and "steps" in obj:  # a Trajectory line
                    traj = Trajectory.model_validate(obj)
                    if splits is None or traj.split in splits:
                        yield from traj.steps
                else:
                    yield Transition.model_validate(obj)
            except ValueError as err:  # JSON or schema
                raise damaged(f"{path}:{n}", "not a Trajectory/Transition record", err) from None


def load_transitions(path: Path, splits: Sequence[str] | None = ("train",)) -> list[Transition]:
    """Read transitions from ingested parquet or trajectory/transition JSONL (split-filtered)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (run the ingest stage first)")
    if path.suffix == ".parquet":
        return list(_read_parquet(path, splits))
    if path.suffix == ".jsonl":
        return list(_read_jsonl(path, splits))
    raise ValueError(f"{path}: expected a .parquet or .jsonl file")


def build_buffer(
    cfg: Config,
    transitions: list[Transition] | Path,
    buffer_dir: Path,
    *,
    splits: Sequence[str] | None = ("train",),
    embedder: Embedder | None = None,
    tag: str = SEED_TAG,
) -> dict[str, Any]:
    """Build (or idempotently bring up to date) the seed buffer from real transitions; stats."""
    # File inputs are split-filtered (default: train only, so validation games cannot leak
    # into fidelity evaluation). Every row must be real. The buffer ends up holding exactly
    # these rows (stale ones are deleted); the version is tagged ``seed``; re-running on
    # the same input writes nothing and keeps the tag.
    start = time.perf_counter()
    rows = (
        load_transitions(transitions, splits)
        if isinstance(transitions, Path)
        else list(transitions)
    )
    if not rows:  # syncing to nothing would delete the whole seed buffer, then exit 0
        from components.io import InputError

        where = transitions if isinstance(transitions, Path) else "the input"
        which = "/".join(splits) + "-split " if splits else ""
        raise InputError(
            f"no real {which}transition in {where}: was every raw line quarantined "
            "(data/quarantine/)? The seed buffer is left as it was"
        )
    synthetic = sum(t.source != "real" for t in rows)
    if synthetic:
        raise ValueError(f"the seed buffer takes real transitions only; got {synthetic} synthetic")
    buf = ReplayBuffer.open(buffer_dir, cfg.buffer, embedder=embedder)
    result, removed = buf.sync(rows)
    tags = buf.tags()
    # A re-run of the stage on the same input leaves the version unchanged: keep the tag.
    if tag not in tags or tags[tag] != buf.version:
        buf.tag(tag, overwrite=True)
    stats = buf.stats()
    embedded = result.inserted
    return {
        **{k: v for k, v in stats.items() if not isinstance(v, dict)},
        "rows_by_env": stats["rows_by_env"],
        "input_rows": len(rows),
        "inserted": result.inserted,
        "already_present": result.already_present,
        "removed_stale": removed,
        "duplicates_in_batch": result.duplicates_in_batch,
        "embed_seconds": round(result.embed_seconds, 3),
        "embed_rows_per_s": round(embedded / result.embed_seconds, 1)
        if result.embed_seconds > 0
        else 0.0,
        "write_seconds": round(result.write_seconds, 3),
        "seconds": round(time.perf_counter() - start, 3),
        "tag": tag,
        "path": str(buffer_dir),
    }
