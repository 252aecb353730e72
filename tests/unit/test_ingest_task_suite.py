"""Ingest checks every row against the task suite: unknown task, wrong split, wrong env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import IngestConfig
from components.data.ingest import QUARANTINE_FILE, REPORT_FILE, ingest
from components.schema import Trajectory, read_jsonl, write_jsonl
from tests.factories import make_task, make_trajectory

CFG = IngestConfig(max_line_bytes=20_000, max_state_chars=500, max_action_chars=50)
TASKS = [
    make_task("tw-train-0", split="train"),
    make_task("tw-test-0", split="test"),
    make_task("tw-val-0", split="validation"),
]


def _env(traj: Trajectory, env: str, steps_only: bool = False) -> str:
    obj = json.loads(traj.model_dump_json())
    if not steps_only:
        obj["env"] = env
    for step in obj["steps"]:
        step["env"] = env
    return json.dumps(obj)


def _raw(path: Path) -> dict[str, Trajectory]:
    """Good rows plus one row for each way a row can disagree with the suite."""
    rows = {
        "good_train": make_trajectory(task_id="tw-train-0", idx=0, split="train"),
        "good_test": make_trajectory(task_id="tw-test-0", idx=1, split="test"),
        "test_as_train": make_trajectory(task_id="tw-test-0", idx=2, split="train"),
        "val_as_train": make_trajectory(task_id="tw-val-0", idx=3, split="train"),
        "unknown": make_trajectory(task_id="tw-nowhere-9", idx=4, split="train"),
        "env": make_trajectory(task_id="tw-train-0", idx=5, split="train"),
        "step_env": make_trajectory(task_id="tw-train-0", idx=6, split="train"),
    }
    lines = [r.model_dump_json() for k, r in rows.items() if "env" not in k]
    lines += [_env(rows["env"], "alfworld"), _env(rows["step_env"], "alfworld", steps_only=True)]
    path.write_text("\n".join(lines) + "\n")
    return rows


def test_rows_that_disagree_with_the_task_suite_are_quarantined(tmp_path: Path):
    raw = tmp_path / "raw.jsonl"
    rows = _raw(raw)
    out, quarantine = tmp_path / "ingested", tmp_path / "quarantine"

    report = ingest([raw], out, quarantine, CFG, TASKS)

    kept = [t.episode_id for t in read_jsonl(out / "trajectories.jsonl", Trajectory)]
    assert kept == [rows["good_train"].episode_id, rows["good_test"].episode_id]
    assert (report.n_ingested, report.n_quarantined) == (2, 5)
    why = {
        q["episode_id"]: " ; ".join(q["reasons"])
        for q in map(json.loads, (quarantine / QUARANTINE_FILE).read_text().splitlines())
    }
    assert (
        "split mismatch: 'train', task 'tw-test-0' is in 'test'"
        in why[rows["test_as_train"].episode_id]
    )
    assert "split mismatch" in why[rows["val_as_train"].episode_id]
    assert "unknown task_id: 'tw-nowhere-9'" in why[rows["unknown"].episode_id]
    assert "env mismatch: 'alfworld'" in why[rows["env"].episode_id]
    assert "step 0: env mismatch: 'alfworld'" in why[rows["step_env"].episode_id]
    counted = json.loads((quarantine / REPORT_FILE).read_text())["reasons"]
    assert counted == {"env mismatch": 2, "split mismatch": 2, "unknown task_id": 1}


def test_ingest_stage_checks_rows_against_data_tasks(tmp_path: Path, monkeypatch):
    """`dreamgym ingest` itself: a test game's row labelled train never reaches train."""
    import components.tracking
    from components.stages import data as data_stage
    from tests.reliability.project import make_project

    class NoTracking:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def __getattr__(self, name: str):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(components.tracking, "stage_run", NoTracking)
    cfg, paths = make_project(tmp_path)
    write_jsonl(paths.tasks_file, TASKS)
    paths.raw.mkdir(parents=True)
    _raw(paths.raw / "collected.jsonl")

    metrics = data_stage.ingest(cfg, paths)

    kept = list(read_jsonl(paths.trajectories_file, Trajectory))
    assert [(t.task_id, t.split) for t in kept] == [("tw-train-0", "train"), ("tw-test-0", "test")]
    assert metrics["n_quarantined"] == 5


def test_without_a_suite_nothing_is_checked_against_one(tmp_path: Path):
    raw = tmp_path / "raw.jsonl"
    _raw(raw)
    report = ingest([raw], tmp_path / "o", tmp_path / "q", CFG)
    assert report.n_quarantined == 0


@pytest.mark.parametrize("tasks", [[], TASKS[1:]])
def test_every_row_of_a_task_outside_the_suite_is_quarantined(tmp_path: Path, tasks):
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, [make_trajectory(task_id="tw-train-0", idx=i) for i in range(3)])
    report = ingest([raw], tmp_path / "o", tmp_path / "q", CFG, tasks)
    assert (report.n_ingested, report.reasons) == (0, {"unknown task_id": 3})


def test_provenance_seeds_survive_the_parquet_exactly(tmp_path: Path):
    # a None seed beside ints made the column float64: 2**53 + 1 came back as 2**53,
    # and 2**63 - 1 (a valid seed) failed the whole buffer build
    from components.buffer import load_transitions

    seeds = [None, 2**53 + 1, 2**63 - 1]
    lines = []
    for i, seed in enumerate(seeds):
        obj = json.loads(make_trajectory(2, idx=i).model_dump_json())
        for step in obj["steps"]:
            step["provenance"]["seed"] = seed
        lines.append(json.dumps(obj) + "\n")
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(lines))
    report = ingest([raw], tmp_path / "out", tmp_path / "q", CFG, [make_task()])
    assert report.n_ingested == 3
    got = {t.provenance.seed for t in load_transitions(tmp_path / "out" / "transitions.parquet")}
    assert got == set(seeds)
