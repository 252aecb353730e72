"""Ingest raw trajectory JSONL: parse, validate (Great Expectations), quarantine, write.

Every input line ends up in exactly one place: the ingested trajectories, or the
quarantine with the reasons it failed (too long or too deeply nested, checked before
parsing; undecodable bytes, invalid JSON, wrong structure, duplicate episode or
transition id, failed expectations, schema errors in strict mode: no type coercion,
integers bounded as stored; given the task suite, a task_id it does not hold, or a split
or env other than the task's). Counts always add up, a bad line never aborts the batch,
and quarantined lines keep their original content so they can be fixed and re-ingested.
A duplicate quarantines only the later line; the first one is kept.

The five outputs are written together (components/io.py): all of them to temporary
files first, then renamed, so a failure leaves the previous outputs as they were.
"""

from __future__ import annotations

import base64
import json
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from json.decoder import scanstring
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from components.config import IngestConfig
from components.data.validation import (
    LINE_EPISODE,
    LINE_ID,
    REQUIRED,
    ROW_ID,
    validate_transitions,
)
from components.io import InputError, atomic_outputs, remove_stale_temps
from components.schema import Task, Trajectory

QUARANTINE_FILE = "quarantined.jsonl"
REPORT_FILE = "report.json"
TRAJECTORIES_FILE = "trajectories.jsonl"
TRANSITIONS_FILE = "transitions.parquet"
VALIDATION_FILE = "validation.json"
_JSON_TOKEN = re.compile(r'[\[\]{}"]')


@dataclass(frozen=True)
class RawLine:
    """One line of an input file, as bytes, with where it came from."""

    file: str
    line_no: int
    data: bytes


@dataclass
class _Candidate:
    line: RawLine
    obj: dict[str, Any]
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class IngestReport:
    """What happened to every line."""

    n_lines: int
    n_ingested: int
    n_quarantined: int
    n_transitions: int
    reasons: dict[str, int]
    validation: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON/MLflow."""
        return {
            "n_lines": self.n_lines,
            "n_ingested": self.n_ingested,
            "n_quarantined": self.n_quarantined,
            "n_transitions": self.n_transitions,
            "reasons": self.reasons,
            "validation": self.validation,
        }


def iter_raw_lines(paths: list[Path]) -> Iterator[RawLine]:
    """Yield every line of the given files as bytes (newline stripped), in order."""
    for path in paths:
        with path.open("rb") as f:
            for i, data in enumerate(f, start=1):
                yield RawLine(str(path), i, data.rstrip(b"\r\n"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON: a non-finite number")


def _too_deep(text: str, limit: int) -> bool:
    """True if brackets outside strings nest deeper than ``limit`` (no parsing, no recursion)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, pos = 0, 0
    while match := _JSON_TOKEN.search(text, pos):
        char, pos = match.group(), match.end()
        if char == '"':
            try:
                _, pos = scanstring(text, pos)  # C speed, linear: skips the string
            except ValueError:
                return False  # an unterminated string: the parser reports it
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _parse(line: RawLine, cfg: IngestConfig) -> tuple[dict[str, Any] | None, str | None]:
    if len(line.data) > cfg.max_line_bytes:
        return None, f"line too long ({len(line.data)} bytes > {cfg.max_line_bytes})"
    try:
        text = line.data.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"invalid UTF-8 (at byte {err.start})"
    if not text.strip():
        return None, "empty line"
    # before parsing: deep nesting overflows the recursion of the parser or, worse, of the
    # validation below (which would lose the whole batch)
    if _too_deep(text, cfg.max_depth):
        return None, f"nested too deeply (more than ingest.max_depth={cfg.max_depth} levels)"
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        return None, f"invalid JSON: {err.msg} (column {err.colno})"
    except ValueError as err:  # NaN/Infinity, or an integer beyond Python's 4300-digit limit
        return None, f"invalid JSON: {str(err).split(':', 1)[0]}"
    except RecursionError:  # nesting deeper than the parser's recursion limit
        return None, "invalid JSON: nested too deeply"
    try:
        # "\ud800" escapes decode to lone surrogates that no UTF-8 writer accepts later
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None, "invalid text: lone UTF-16 surrogate escape"
    if not isinstance(obj, dict):
        return None, f"structure: expected a JSON object, got {type(obj).__name__}"
    if not isinstance(obj.get("episode_id"), str) or not obj["episode_id"]:
        return None, "structure: missing or non-string episode_id"
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        return None, "structure: steps must be a non-empty list"
    if not all(isinstance(s, dict) for s in steps):
        return None, "structure: every step must be a JSON object"
    return obj, None


def _flatten(candidates: list[_Candidate]) -> Any:
    import pandas as pd

    rows = []
    for line_id, cand in enumerate(candidates):
        for step in cand.obj["steps"]:
            row = {k: step.get(k) for k in step if k not in ("provenance", "admissible_actions")}
            row.update({ROW_ID: len(rows), LINE_ID: line_id, LINE_EPISODE: cand.obj["episode_id"]})
            rows.append(row)
    columns = dict.fromkeys(REQUIRED)  # every required column, even if no row has it
    for row in rows:
        columns.update(dict.fromkeys(row))
    # column by column as Python objects: a frame built from the rows would make a numeric
    # column of a key that some rows lack (reward 1 -> 1.0) and fail their type checks
    df = pd.DataFrame({c: pd.Series([row.get(c) for row in rows], dtype=object) for c in columns})
    return df.astype({ROW_ID: int, LINE_ID: int})


def _raw_payload(data: bytes) -> dict[str, str]:
    try:
        return {"raw": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"raw_base64": base64.b64encode(data).decode("ascii")}


def _transitions_frame(trajectories: list[Trajectory]) -> Any:
    import pandas as pd

    rows = []
    for traj in trajectories:
        for s in traj.steps:
            row = s.model_dump(mode="json", exclude={"provenance"})
            row.update({f"provenance_{k}": v for k, v in s.provenance.model_dump().items()})
            row["split"] = traj.split
            rows.append(row)
    frame = pd.DataFrame(rows)
    if rows:  # None beside ints made a float64 column: seeds past 2**53 came back changed
        frame["provenance_seed"] = pd.array([r["provenance_seed"] for r in rows], dtype="Int64")
    return frame


def check_inputs(raw_files: list[Path]) -> None:
    """Every input must be a regular file (a folder named ``x.jsonl`` is a user error)."""
    for path in raw_files:
        if path.is_dir():
            raise InputError(f"{path} is a folder, not a JSONL file: move or rename it")
        if not path.is_file():
            raise InputError(f"{path} is not a regular file (missing, or a device/socket)")


def ingest(
    raw_files: list[Path],
    out_dir: Path,
    quarantine_dir: Path,
    cfg: IngestConfig,
    tasks: Iterable[Task] | None = None,
) -> IngestReport:
    """Validate raw trajectory files (against ``tasks`` if given); write data and quarantine."""
    suite = None if tasks is None else {t.task_id: t for t in tasks}
    check_inputs(raw_files)  # before anything is written: the previous outputs stay
    for folder in (out_dir, quarantine_dir):
        remove_stale_temps(folder)  # left by a run that was killed while writing
    quarantined: list[dict[str, Any]] = []
    n_lines = 0

    def reject(line: RawLine, reasons: list[str], episode_id: str | None = None) -> None:
        quarantined.append(
            {
                "file": line.file,
                "line_no": line.line_no,
                "episode_id": episode_id,
                "reasons": reasons,
                **_raw_payload(line.data),
            }
        )

    parsed: list[tuple[RawLine, dict[str, Any]]] = []
    for line in iter_raw_lines(raw_files):
        n_lines += 1
        obj, reason = _parse(line, cfg)
        if obj is None:
            reject(line, [reason or "unparseable"])
        else:
            parsed.append((line, obj))

    # Duplicates are set aside before validation (its uniqueness check would fail both
    # copies), but a line that then fails validation holds no ids: deduplication is redone
    # from scratch over the remaining lines, in file order, so a bad copy never costs the
    # valid original and a later duplicate never wins over an earlier line. Only the lines
    # a round newly admits are validated (a line's checks do not depend on the others);
    # the outcome is that of the first round with no new failures.
    validation: dict[str, Any] = {"success": True, "n_rows": 0}
    valid: dict[int, Trajectory] = {}  # id(line) -> its trajectory, once validated
    bad: set[int] = set()  # id(line) of the lines that failed validation
    while True:
        remaining = [(line, obj) for line, obj in parsed if id(line) not in bad]
        candidates, displaced = _deduplicate(remaining)
        todo = [c for c in candidates if id(c.line) not in valid]
        passed: list[Trajectory] = []
        failed = _validate(todo, cfg, validation, passed, suite)
        lost = {id(c.line) for c in failed}
        ok = [id(c.line) for c in todo if id(c.line) not in lost]
        valid.update(zip(ok, passed, strict=True))
        if not failed:
            break
        for cand in failed:
            reject(cand.line, sorted(set(cand.reasons)), cand.obj["episode_id"])
        bad |= lost
    for line, obj, why, _ in displaced:
        reject(line, [why], obj["episode_id"])
    ingested = [valid[id(c.line)] for c in candidates]

    assert len(ingested) + len(quarantined) == n_lines, "every line must be accounted for"
    # count each kind of failure once per quarantined line
    reasons = Counter(kind for q in quarantined for kind in {_reason_kind(r) for r in q["reasons"]})
    report = IngestReport(
        n_lines=n_lines,
        n_ingested=len(ingested),
        n_quarantined=len(quarantined),
        n_transitions=sum(t.n_steps for t in ingested),
        reasons=dict(sorted(reasons.items())),
        validation=validation,
    )
    frame = _transitions_frame(ingested)
    # all five files are written first and renamed only when every one succeeded
    with atomic_outputs() as temp:
        text = "".join(t.model_dump_json() + "\n" for t in ingested)
        temp(out_dir / TRAJECTORIES_FILE).write_text(text, encoding="utf-8")
        frame.to_parquet(temp(out_dir / TRANSITIONS_FILE), index=False)
        text = json.dumps(validation, indent=2) + "\n"
        temp(out_dir / VALIDATION_FILE).write_text(text, encoding="utf-8")
        text = "".join(json.dumps(q) + "\n" for q in quarantined)
        temp(quarantine_dir / QUARANTINE_FILE).write_text(text, encoding="utf-8")
        text = json.dumps(report.as_dict(), indent=2) + "\n"
        temp(quarantine_dir / REPORT_FILE).write_text(text, encoding="utf-8")
    return report


def _deduplicate(
    lines: list[tuple[RawLine, dict[str, Any]]],
) -> tuple[list[_Candidate], list[tuple[RawLine, dict[str, Any], str, RawLine]]]:
    """(candidates, displaced lines with their reason and the line they lost to): a
    line whose episode id or a transition id an earlier line holds is displaced."""
    seen: dict[str, tuple[RawLine, bytes]] = {}
    claimed: dict[str, RawLine] = {}  # transition id -> the line that used it first
    candidates: list[_Candidate] = []
    displaced: list[tuple[RawLine, dict[str, Any], str, RawLine]] = []
    for line, obj in lines:
        episode_id = obj["episode_id"]
        if episode_id in seen:
            first, first_data = seen[episode_id]
            kind = "duplicate of" if first_data == line.data else "conflicting duplicate of"
            why = f"duplicate episode_id: {kind} {first.file}:{first.line_no}"
            displaced.append((line, obj, why, first))
            continue
        # a transition id used by an earlier line: only this later line is set aside
        ids = {s["id"] for s in obj["steps"] if isinstance(s.get("id"), str)}
        reused = sorted(ids & claimed.keys())
        if reused:
            first = claimed[reused[0]]
            why = (
                f"duplicate transition id: {reused[0]!r} already used by "
                f"{first.file}:{first.line_no}"
            )
            displaced.append((line, obj, why, first))
            continue
        seen[episode_id] = (line, line.data)
        claimed.update(dict.fromkeys(ids, line))
        candidates.append(_Candidate(line, obj))
    return candidates, displaced


def _validate(
    candidates: list[_Candidate],
    cfg: IngestConfig,
    validation: dict[str, Any],
    ingested: list[Trajectory],
    suite: dict[str, Task] | None = None,
) -> list[_Candidate]:
    """Great Expectations, the task suite, then the strict schema: the valid lines go to
    ``ingested``, the expectations' summary into ``validation`` (counts added up over
    rounds); returns the failed candidates with their reasons."""
    if not candidates:
        return []
    outcome = validate_transitions(_flatten(candidates), cfg)
    if validation.get("n_rows"):  # a later round: add its counts to the first's
        validation["success"] = validation["success"] and outcome.summary["success"]
        for key in ("n_rows", "n_failed_rows"):
            validation[key] = validation.get(key, 0) + outcome.summary.get(key, 0)
    else:
        validation.clear()
        validation.update(outcome.summary)
    # rows were numbered line by line, so a row maps back by its line's first row
    starts = list(accumulate((len(c.obj["steps"]) for c in candidates), initial=0))
    for rid, reasons in outcome.failures.items():
        lid = bisect_right(starts, rid) - 1
        candidates[lid].reasons.extend(f"step {rid - starts[lid]}: {r}" for r in reasons)
    for cand in candidates:
        cand.reasons.extend(_source_reasons(cand.obj))
        if suite is not None:
            cand.reasons.extend(_task_reasons(cand.obj, suite))
    failed = []
    for cand in candidates:
        if not cand.reasons:
            try:
                # strict: "true" is not a bool and "3" is not an int (no silent coercion)
                ingested.append(Trajectory.model_validate(cand.obj, strict=True))
                continue
            except ValidationError as err:
                cand.reasons.extend(
                    "schema: " + ".".join(str(p) for p in e["loc"]) + f": {e['msg']}"
                    for e in err.errors()
                )
        failed.append(cand)
    return failed


def _source_reasons(obj: dict[str, Any]) -> list[str]:
    """Why a line is not a real episode: the offline logs (and the seed buffer built from
    them) hold real transitions only; a dreamt one here would pass for the simulator's."""
    sources = [("", obj.get("source"))] + [
        (f"step {i}: ", s.get("source")) for i, s in enumerate(obj["steps"])
    ]
    return [
        f"{where}source {src!r}: the offline logs take real episodes only"
        for where, src in sources
        if isinstance(src, str) and src != "real"
    ]


def _task_reasons(obj: dict[str, Any], suite: dict[str, Task]) -> list[str]:
    """Why a line does not belong to the task suite: an unknown task, or a split or env
    other than its task's (the buffer and SFT trust the row's split: a mislabelled test
    game would be trained on)."""
    task_id = obj.get("task_id")
    if not isinstance(task_id, str):
        return []  # the schema names the missing or mistyped field
    task = suite.get(task_id)
    if task is None:
        return [f"unknown task_id: {task_id!r} is not in the task suite"]
    reasons = []
    split = obj.get("split")
    if isinstance(split, str) and split != task.split:
        reasons.append(f"split mismatch: {split!r}, task {task_id!r} is in {task.split!r}")
    # the steps' env too: the schema ties their task_id to the line's, not their env
    envs = [("", obj.get("env"))] + [
        (f"step {i}: ", s.get("env")) for i, s in enumerate(obj["steps"])
    ]
    for where, env in envs:
        if isinstance(env, str) and env != task.env:
            reasons.append(f"{where}env mismatch: {env!r}, task {task_id!r} is in {task.env!r}")
    return reasons


def _reason_kind(reason: str) -> str:
    """Group reasons for counting: 'invalid JSON: ...' -> 'invalid JSON'."""
    text = reason.split(": ", 1)[1] if reason.startswith("step ") else reason
    return text.split(":", 1)[0].split(" (", 1)[0].strip()
