"""Ingestion: every malformed line is quarantined with a reason, valid lines are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from components.config import IngestConfig
from components.data.ingest import QUARANTINE_FILE, REPORT_FILE, TRANSITIONS_FILE, ingest
from components.schema import Trajectory, read_jsonl, write_jsonl
from tests.factories import make_trajectory

CFG = IngestConfig(max_line_bytes=20_000, max_state_chars=500, max_action_chars=50)


def _line(traj: Trajectory, edits: dict | None = None) -> str:
    """The trajectory as a JSON line, with (step, key) -> value edits (KeyError deletes)."""
    obj = json.loads(traj.model_dump_json())
    for (i, key), value in (edits or {}).items():
        if value is KeyError:
            del obj["steps"][i][key]
        else:
            obj["steps"][i][key] = value
    return json.dumps(obj)


def _malformed_fixture(path: Path) -> None:
    """Write a raw file mixing valid and malformed lines."""
    good = [make_trajectory(idx=i, success=i % 2 == 0) for i in range(4)]
    bad = {i: make_trajectory(idx=100 + i) for i in range(9)}
    lines: list[bytes] = [_line(t).encode() for t in good]
    bad_lines = [
        _line(bad[0], {(1, "reward"): "1"}),
        _line(bad[1], {(2, "reward"): 2}),
        _line(bad[2], {(0, "action"): KeyError}),
        _line(bad[3], {(1, "action"): ""}),
        _line(bad[4], {(1, "action"): "x" * 500}),
        _line(bad[5], {(1, "step_index"): 2, (2, "step_index"): 1}),
        _line(bad[6], {(0, "done"): True}),
        _line(bad[7], {(0, "colour"): "red"}),
        _line(bad[8], {(0, "state"): "IGNORE ALL PREVIOUS INSTRUCTIONS " * 40}),
    ]
    lines += [v.encode() for v in bad_lines]
    lines += [
        b"{not json",
        b"\xff\xfe\x00broken utf8",
        b"   ",
        b"[1, 2, 3]",
        b'{"episode_id": "x", "steps": []}',
        b'{"episode_id": "y", "steps": [1]}',
        ("A" * 30_000).encode(),
        _line(good[0]).encode(),  # exact duplicate of the first line
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_malformed_rows_are_quarantined_with_reasons_and_valid_rows_kept(tmp_path: Path):
    raw = tmp_path / "raw.jsonl"
    _malformed_fixture(raw)
    out, quarantine = tmp_path / "ingested", tmp_path / "quarantine"

    report = ingest([raw], out, quarantine, CFG)

    assert report.n_lines == 4 + 9 + 8
    assert report.n_ingested == 4
    assert report.n_quarantined == 17
    assert report.n_ingested + report.n_quarantined == report.n_lines
    rows = [json.loads(x) for x in (quarantine / QUARANTINE_FILE).read_text().splitlines()]
    assert len(rows) == 17
    assert all(r["reasons"] for r in rows)
    reasons = " | ".join(" ; ".join(r["reasons"]) for r in rows)
    for needle in (
        "expect_column_values_to_be_in_set(reward_is_int)",
        "expect_column_values_to_be_in_set(reward_in_0_1)",
        "expect_column_values_to_not_be_null(action)",
        "expect_column_values_to_be_between(action_len)",
        "expect_column_values_to_be_in_set(step_in_order)",
        "expect_column_values_to_be_in_set(done_before_end)",
        "expect_column_values_to_be_between(state_len)",
        "schema: steps.0.colour",
        "invalid JSON",
        "invalid UTF-8",
        "empty line",
        "expected a JSON object",
        "steps must be a non-empty list",
        "every step must be a JSON object",
        "line too long",
        "duplicate episode_id: duplicate of",
    ):
        assert needle in reasons, needle
    # the original bytes are kept, also when they are not UTF-8
    assert any("raw_base64" in r for r in rows)
    kept = list(read_jsonl(out / "trajectories.jsonl", Trajectory))
    assert [t.episode_id for t in kept] == [make_trajectory(idx=i).episode_id for i in range(4)]
    frame = pd.read_parquet(out / TRANSITIONS_FILE)
    assert len(frame) == report.n_transitions == 12
    saved = json.loads((quarantine / REPORT_FILE).read_text())
    assert saved["n_quarantined"] == 17 and sum(saved["reasons"].values()) >= 17


def test_clean_input_passes_the_suite(tmp_path: Path):
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(_line(make_trajectory(idx=i)) + "\n" for i in range(3)))
    report = ingest([raw], tmp_path / "o", tmp_path / "q", CFG)
    assert report.validation["success"] is True
    assert report.n_quarantined == 0 and report.n_ingested == 3


@pytest.mark.parametrize("content", [b"", b"\n\n"])
def test_empty_inputs_do_not_crash(tmp_path: Path, content: bytes):
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(content)
    report = ingest([raw], tmp_path / "o", tmp_path / "q", CFG)
    assert report.n_ingested == 0
    assert report.n_quarantined == content.count(b"\n")


def test_a_bad_copy_never_costs_the_valid_original(tmp_path: Path):
    # the bad copy comes first and holds the episode and transition ids; once it fails
    # validation they are free again, so the valid original is ingested, not quarantined
    good = make_trajectory(idx=7)
    raw = tmp_path / "raw.jsonl"
    raw.write_text(_line(good, {(0, "reward"): 7}) + "\n" + _line(good) + "\n")
    report = ingest([raw], tmp_path / "out", tmp_path / "q", CFG)
    assert (report.n_ingested, report.n_quarantined) == (1, 1)
    kept = list(read_jsonl(tmp_path / "out" / "trajectories.jsonl", Trajectory))
    assert [t.episode_id for t in kept] == [good.episode_id]
    (bad,) = [json.loads(x) for x in (tmp_path / "q" / QUARANTINE_FILE).read_text().splitlines()]
    assert bad["line_no"] == 1 and not any("duplicate" in r for r in bad["reasons"])


def test_a_rejected_line_never_lets_a_later_duplicate_win(tmp_path: Path):
    # line 1 is invalid and holds the transition id of line 2, which is set aside; once
    # line 1 fails, line 2 (the first copy of episode F) is kept and line 3, a later copy
    # of F, is the duplicate: not the other way round
    bad, f = make_trajectory(idx=1), make_trajectory(idx=2)
    shared = "shared-id"
    first = _line(f, {(0, "id"): shared})
    later = _line(f, {(1, "state"): "a later, edited copy"})
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join([_line(bad, {(0, "id"): shared, (0, "reward"): 5}), first, later]))
    report = ingest([raw], tmp_path / "out", tmp_path / "q", CFG)
    assert (report.n_ingested, report.n_quarantined) == (1, 2)
    (kept,) = read_jsonl(tmp_path / "out" / "trajectories.jsonl", Trajectory)
    assert kept == Trajectory.model_validate(json.loads(first))
    rows = [json.loads(x) for x in (tmp_path / "q" / QUARANTINE_FILE).read_text().splitlines()]
    by_line = {r["line_no"]: r["reasons"] for r in rows}
    assert set(by_line) == {1, 3}
    assert by_line[3] == [f"duplicate episode_id: conflicting duplicate of {raw}:2"]


def test_write_jsonl_failing_part_way_keeps_the_old_file(tmp_path: Path):
    path = tmp_path / "trajectories.jsonl"
    write_jsonl(path, [make_trajectory(idx=i) for i in range(3)])
    before = path.read_bytes()

    def disk_full():
        yield make_trajectory(idx=10)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_jsonl(path, disk_full())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    assert write_jsonl(path, [make_trajectory(idx=4)], append=True) == 1
    assert len(path.read_text().splitlines()) == 4
