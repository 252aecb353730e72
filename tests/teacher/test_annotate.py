"""annotate(): resumable, append-only, keyed by transition id; kills lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from components.config import TeacherConfig
from components.schema import write_jsonl
from components.teacher import (
    Annotation,
    AnnotationFileError,
    AnnotationRequest,
    GroundedTeacher,
    TeacherError,
    annotate,
    failures_path_for,
    iter_annotations,
    load_annotations,
    make_teacher,
)
from tests.teacher.conftest import ROOT, make_config, make_trajectories

pytestmark = pytest.mark.timeout(60)
KEYS = {"id", "reasoning", "backend", "model", "prompt_tokens", "completion_tokens"}


def ids_in(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def all_ids(trajs) -> list[str]:
    return [s.id for t in trajs for s in t.steps]


class CrashingTeacher(GroundedTeacher):
    """Grounded answers, then a crash after ``n_ok`` transitions (simulated kill)."""

    def __init__(self, n_ok: int) -> None:
        super().__init__(batch_size=3)
        self.left = n_ok

    def annotate(self, batch, on_result=None):
        out = []
        for req in batch:
            if self.left == 0:
                raise RuntimeError("simulated crash")
            self.left -= 1
            out += super().annotate([req], on_result)
        return out


class RecordingTeacher(GroundedTeacher):
    """Grounded answers; keeps the requests; ignores on_result (returns only)."""

    def __init__(self) -> None:
        super().__init__(batch_size=5)
        self.seen: list[AnnotationRequest] = []

    def annotate(self, batch: Sequence[AnnotationRequest], on_result=None) -> list[Annotation]:
        self.seen += batch
        return super().annotate(batch)


def test_grounded_end_to_end_and_rerun_skips(tmp_path) -> None:
    cfg = make_config()
    trajs = make_trajectories(3, 4)
    out = tmp_path / "ann" / "annotations.jsonl"
    stats = annotate(cfg, trajs, out, progress=False)
    assert stats["n_annotated"] == 12 and stats["n_failed"] == 0 and stats["complete"]
    assert stats["backend"] == "grounded" and stats["tokens"] == 0 and stats["cost_usd"] == 0
    assert {"n_skipped_existing", "seconds", "prompt_tokens", "completion_tokens"} <= set(stats)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(set(r) == KEYS for r in rows)
    assert [r["id"] for r in rows] == all_ids(trajs)
    assert failures_path_for(out).exists() and failures_path_for(out).read_text() == ""

    again = annotate(cfg, iter(trajs), out, progress=False)  # a generator works too
    assert (again["n_annotated"], again["n_skipped_existing"]) == (0, 12)
    assert ids_in(out) == all_ids(trajs)
    ann = load_annotations(out)
    assert set(ann) == set(all_ids(trajs)) and all(ann.values())


def test_crash_midway_then_resume_loses_and_duplicates_nothing(tmp_path) -> None:
    cfg = make_config()
    trajs = make_trajectories(3, 4)
    out = tmp_path / "a.jsonl"
    with pytest.raises(RuntimeError, match="simulated crash"):
        annotate(cfg, trajs, out, teacher=CrashingTeacher(n_ok=5), progress=False)
    assert ids_in(out) == all_ids(trajs)[:5]
    stats = annotate(cfg, trajs, out, progress=False)
    assert (stats["n_annotated"], stats["n_skipped_existing"]) == (7, 5)
    assert sorted(ids_in(out)) == sorted(all_ids(trajs))


def test_torn_last_line_is_dropped_and_redone(tmp_path) -> None:
    cfg = make_config()
    trajs = make_trajectories(2, 3)
    out = tmp_path / "a.jsonl"
    with pytest.raises(RuntimeError):
        annotate(cfg, trajs, out, teacher=CrashingTeacher(n_ok=2), progress=False)
    third = all_ids(trajs)[2]
    with out.open("a") as f:
        f.write('{"id": "' + third + '", "reasoning": "half a li')  # killed mid-write
    assert [r["id"] for r in iter_annotations(out)] == all_ids(trajs)[:2]  # read-only view
    stats = annotate(cfg, trajs, out, progress=False)
    assert stats["n_skipped_existing"] == 2 and stats["n_annotated"] == 4
    assert ids_in(out) == all_ids(trajs)  # parses: no torn text left


def test_corrupt_middle_line_is_an_error(tmp_path) -> None:
    out = tmp_path / "a.jsonl"
    out.write_text('{"id": "a", "reasoning": "x"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(AnnotationFileError, match=":2:"):
        annotate(make_config(), make_trajectories(1, 1), out, progress=False)


def test_kill_9_subprocess_then_resume(tmp_path) -> None:
    trajs = make_trajectories(4, 5)
    traj_file = tmp_path / "trajectories.jsonl"
    write_jsonl(traj_file, trajs)
    out = tmp_path / "a.jsonl"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from components.config import load_config
        from components.schema import Trajectory, read_jsonl
        from components.teacher import GroundedTeacher, annotate

        class Slow(GroundedTeacher):
            def annotate(self, batch, on_result=None):
                out = []
                for req in batch:
                    time.sleep(0.05)
                    out += super().annotate([req], on_result)
                return out

        cfg = load_config({str(ROOT / "params.yaml")!r}, profile="ci")
        trajs = list(read_jsonl(Path({str(traj_file)!r}), Trajectory))
        annotate(cfg, trajs, Path({str(out)!r}), teacher=Slow(batch_size=4), progress=False)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if out.exists() and len(out.read_bytes().splitlines()) >= 6:
                break
            assert proc.poll() is None, "annotator exited before it was killed"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    before = ids_in(out)
    assert 6 <= len(before) < 20

    with out.open("a") as f:
        f.write('{"id": "torn')  # as if the kill had landed mid-line
    stats = annotate(make_config(), trajs, out, progress=False)
    after = ids_in(out)
    assert after[: len(before)] == before  # append-only
    assert sorted(after) == sorted(all_ids(trajs)) and len(after) == len(set(after))
    assert stats["n_skipped_existing"] == len(before)
    assert stats["n_annotated"] == 20 - len(before)


def test_history_and_dedup_and_return_only_teachers(tmp_path) -> None:
    cfg = make_config(history_len=2)
    trajs = make_trajectories(2, 4)
    teacher = RecordingTeacher()
    stats = annotate(cfg, trajs + trajs[:1], tmp_path / "a.jsonl", teacher=teacher, progress=False)
    assert stats["n_annotated"] == 8 and stats["n_duplicate_inputs"] == 4
    assert [len(r.history) for r in teacher.seen] == [0, 1, 2, 2] * 2
    assert [h.step_index for h in teacher.seen[3].history] == [1, 2]
    assert len(ids_in(tmp_path / "a.jsonl")) == 8  # written once though on_result was ignored


def test_resume_false_starts_over(tmp_path) -> None:
    cfg = make_config()
    out = tmp_path / "a.jsonl"
    annotate(cfg, make_trajectories(1, 2), out, progress=False)
    stats = annotate(cfg, make_trajectories(1, 2), out, progress=False, resume=False)
    assert stats["n_annotated"] == 2 and len(ids_in(out)) == 2


def test_make_teacher_backends(monkeypatch) -> None:
    assert isinstance(make_teacher(TeacherConfig()), GroundedTeacher)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(TeacherError, match="OPENAI_API_KEY"):
        make_teacher(TeacherConfig(backend="openai"))
    with pytest.raises(TeacherError, match="cannot load"):
        make_teacher(TeacherConfig(backend="hf", model=str(ROOT / "no-such-model-dir")))
