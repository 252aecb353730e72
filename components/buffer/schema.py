"""The buffer table's layout: columns, schema metadata, and rows <-> ``Transition``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from components.buffer.errors import BufferCorruptedError, BufferSchemaError
from components.schema import Provenance, Transition

TABLE_NAME = "transitions"
TABLE_DIR = f"{TABLE_NAME}.lance"  # the table's folder inside the buffer directory
LOCK_FILE = f"{TABLE_NAME}.lance.lock"  # next to the table: serialises writing processes
SCHEMA_VERSION = "1"
META_SCHEMA_VERSION = b"dreamgym.buffer.schema_version"
META_EMBEDDER = b"dreamgym.buffer.embedder"
META_DIM = b"dreamgym.buffer.dim"
VECTOR_COLUMN = "embedding"
VECTOR_INDEX_PREFIX = "embedding_ivf_flat_p"  # the partition count is encoded in the name


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


def check_schema(schema: pa.Schema, where: str) -> tuple[int, str]:
    """Raise ``BufferSchemaError`` unless ``schema`` is this code's layout; (dim, embedder)."""
    meta = schema.metadata or {}
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
    return dim, stored_embedder


def rows_to_arrow(
    rows: list[Transition],
    vecs: np.ndarray,
    seqs: np.ndarray,
    rkeys: np.ndarray,
    schema: pa.Schema,
    dim: int,
) -> pa.Table:
    """Transitions (flattened provenance) with their keys and vectors as a table batch."""
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
            pa.array(np.ascontiguousarray(vecs, dtype=np.float32).ravel()), dim
        ),
    }
    return pa.table(cols, schema=schema)


def row_to_transition(row: dict[str, Any], where: Any) -> Transition:
    """One table row (``RESULT_COLUMNS``) as a ``Transition``; a bad row is corruption."""
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
            f"{where}: row {row.get('id')!r} is not a valid Transition: {err}"
        ) from err


def vectors(column: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """An embedding column as a (rows, dim) array."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
