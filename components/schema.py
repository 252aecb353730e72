"""Records exchanged by every stage: Task, Transition and Trajectory, stored as JSONL.

One trajectory per JSONL line; each trajectory carries its transitions in order. The same
records describe real and synthetic experience (``source``), so the buffer, the
experience model and the agent never need to know which simulator produced them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_M = TypeVar("_M", bound=BaseModel)
Source = Literal["real", "synthetic"]
Split = Literal["train", "validation", "test"]
# Bounded as stored (parquet int64; the buffer keeps step_index and iteration as int32): an
# out-of-range integer fails validation, not a writer after other outputs were replaced.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Index = Annotated[int, Field(ge=0, le=INT32_MAX)]


def stable_id(*parts: object, n: int = 16) -> str:
    """Deterministic short hex id from the given parts (same parts, same id, any machine)."""
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def seed_int(*parts: object) -> int:
    """A 31-bit seed derived from ``parts`` (stable across processes)."""
    return int(stable_id(*parts, n=8), 16) & 0x7FFFFFFF


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Task(_Record):
    """A task: one game / task variation with its instruction and its split."""

    task_id: str = Field(min_length=1)
    env: str = Field(min_length=1)
    family: str = Field(min_length=1, description="task family, e.g. 'quest', 'cooking'")
    difficulty: Count
    split: Split
    # may be empty: a user's game without a goal is played for exploration (generated tasks
    # are still rejected when empty, by curriculum.selection.well_formed)
    instruction: str = Field(description="the goal shown to the agent ('' for a goal-less game)")
    seed: Int64
    game_file: str | None = Field(default=None, description="path of the real game, if any")
    walkthrough: list[str] | None = None
    generated: bool = Field(default=False, description="written by the task generator")
    external: bool = Field(
        default=False, description="brought by the user (tasks.external): never rewritten"
    )
    parent_task_id: str | None = None

    @field_validator("task_id")
    @classmethod
    def _file_safe(cls, v: str) -> str:
        # a task's episodes are filed under its id (data/raw/<task_id>.jsonl): "../x" wrote
        # outside data/raw, where resume and ingest never look; "a/b" failed the collection
        if "/" in v or "\\" in v or v.startswith(".") or not v.isprintable():
            raise ValueError(
                f"task_id {v!r} names files: no '/', '\\', leading '.' or control characters"
            )
        return v


class Provenance(_Record):
    """Where a transition came from."""

    policy: str = Field(description="collecting policy, e.g. 'expert', 'noisy', 'random'")
    iteration: Index = Field(default=0, description="co-evolution iteration (0 = seed)")
    checkpoint: str | None = Field(default=None, description="policy checkpoint, if a model")
    seed: Int64 | None = None


class Transition(_Record):
    """One step (s_t, a_t) -> (s_{t+1}, r_{t+1}) of an episode."""

    id: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    env: str = Field(min_length=1)
    episode_id: str = Field(min_length=1)
    step_index: Index
    instruction: str = Field(description="the task's instruction ('' for a goal-less game)")
    state: str
    action: str = Field(min_length=1)
    next_state: str
    reward: int = Field(description="outcome reward: 1 only when the task is completed")
    done: bool
    admissible_actions: list[str] | None = None
    valid_action: bool
    source: Source
    provenance: Provenance

    @field_validator("reward")
    @classmethod
    def _binary_reward(cls, v: int) -> int:
        if v not in (0, 1):
            raise ValueError(f"reward must be 0 or 1, got {v}")
        return v

    @staticmethod
    def make_id(episode_id: str, step_index: int) -> str:
        """The deterministic transition id for a step of an episode."""
        return stable_id(episode_id, step_index)


class Trajectory(_Record):
    """A whole episode: the task, the policy and its ordered transitions."""

    episode_id: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    env: str = Field(min_length=1)
    split: Split
    source: Source
    policy: str
    initial_state: str
    steps: list[Transition]
    success: bool
    truncated: bool = Field(default=False, description="stopped by the step limit")

    @model_validator(mode="after")
    def _consistent(self) -> Trajectory:
        for i, s in enumerate(self.steps):
            if s.step_index != i:
                raise ValueError(f"step {i} has step_index {s.step_index}")
            if s.episode_id != self.episode_id or s.task_id != self.task_id:
                raise ValueError(f"step {i} belongs to another episode or task")
        if self.steps and self.success != bool(self.steps[-1].reward):
            raise ValueError("success must equal the last step's reward")
        return self

    @property
    def n_steps(self) -> int:
        """Number of transitions."""
        return len(self.steps)


def write_jsonl(path: Path, records: Iterable[BaseModel], append: bool = False) -> int:
    """Write records as JSON lines; returns the number written."""
    from components.io import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        return _write_records(path, records, "a")
    # a new file goes through a temporary one: a failure part-way keeps the old file whole
    with atomic_path(path) as tmp:
        return _write_records(tmp, records, "w")


def _write_records(path: Path, records: Iterable[BaseModel], mode: str) -> int:
    """Write records as JSON lines to ``path`` opened with ``mode``; returns how many."""
    n = 0
    with path.open(mode, encoding="utf-8") as f:
        for r in records:
            f.write(r.model_dump_json() + "\n")
            n += 1
    return n


def read_jsonl(path: Path, model: type[_M]) -> Iterator[_M]:
    """Read and validate records of one type from a JSONL file (strict: raises on bad rows).

    The files read here are the pipeline's own outputs: a bad row means the file was
    damaged after its stage wrote it, so the error names the file and line (an
    ``InputError``: one line on the CLI) instead of failing deep in a later stage.
    """
    from pydantic import ValidationError

    from components.io import damaged

    with path.open(encoding="utf-8") as f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):  # noqa: B007 (read in the handler)
                if line.strip():
                    yield model.model_validate(json.loads(line))
        except (ValueError, ValidationError) as err:  # JSON, UTF-8 or schema
            raise damaged(f"{path}:{lineno}", f"not a valid {model.__name__} record", err) from None
