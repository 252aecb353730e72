"""annotate() resumes only annotations made under the current teacher settings."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from components.config import load_config
from components.schema import write_jsonl
from components.stages import data as data_stage
from components.teacher import GroundedTeacher, annotate, failures_path_for
from tests.reliability.project import make_project, without_tracking, write_params
from tests.teacher.conftest import make_config, make_trajectories

pytestmark = pytest.mark.timeout(60)
SETTINGS = "annotations.settings.json"


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def asides(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if "-aside-" in p.name)


class _LLMLike(GroundedTeacher):
    """Grounded answers stamped as an openai teacher (the sampling settings apply to it)."""

    backend = "openai"

    def __init__(self) -> None:
        super().__init__(batch_size=4)
        self.model = "gpt-4o"
        self.asked: list[str] = []

    def annotate(self, batch, on_result=None):
        self.asked += [req.id for req in batch]
        return super().annotate(batch, on_result)


def test_a_changed_setting_sets_the_old_annotations_aside_and_annotates_afresh(
    tmp_path, caplog
) -> None:
    trajs = make_trajectories(3, 4)
    out = tmp_path / "ann" / "annotations.jsonl"
    annotate(make_config(history_len=2), trajs, out, progress=False)
    before = out.read_bytes()
    failures_path_for(out).write_text('{"id": "x", "error": "old"}\n')

    with caplog.at_level(logging.WARNING):
        stats = annotate(make_config(history_len=0), trajs, out, progress=False)

    assert (stats["n_annotated"], stats["n_skipped_existing"]) == (12, 0)
    assert out.read_bytes() != before  # the traces no longer quote the history
    assert failures_path_for(out).read_text() == ""  # the old failures went with their rows
    [aside] = asides(out.parent)
    assert stats["set_aside"] == str(aside)
    assert (aside / "annotations.jsonl").read_bytes() == before
    assert (aside / "annotations.failures.jsonl").read_text() == '{"id": "x", "error": "old"}\n'
    assert json.loads((aside / SETTINGS).read_text())["history_len"] == 2
    assert json.loads((out.parent / SETTINGS).read_text())["history_len"] == 0
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "history_len" in line and str(aside) in line

    again = annotate(make_config(history_len=0), trajs, out, progress=False)
    assert (again["n_annotated"], again["n_skipped_existing"]) == (0, 12)
    assert len(asides(out.parent)) == 1


@pytest.mark.parametrize("change", [{"temperature": 0.7}, {"max_tokens": 64}])
def test_an_llm_teacher_sampling_change_re_annotates(tmp_path, change) -> None:
    trajs = make_trajectories(2, 3)
    out = tmp_path / "annotations.jsonl"
    llm = {"backend": "openai", "model": "gpt-4o"}
    annotate(make_config(**llm), trajs, out, teacher=_LLMLike(), progress=False)

    teacher = _LLMLike()
    stats = annotate(make_config(**llm, **change), trajs, out, teacher=teacher, progress=False)

    assert stats["n_annotated"] == 6 and len(teacher.asked) == 6
    [aside] = asides(tmp_path)
    assert len(rows_of(aside / "annotations.jsonl")) == 6 and len(rows_of(out)) == 6


def test_the_same_settings_resume_and_skip(tmp_path) -> None:
    trajs = make_trajectories(3, 4)
    out = tmp_path / "annotations.jsonl"
    llm = {"backend": "openai", "model": "gpt-4o", "temperature": 0.3}
    annotate(make_config(**llm), trajs[:1], out, teacher=_LLMLike(), progress=False)
    # how the teacher is reached, retried, batched or paid for changes no annotation
    reach = {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "OTHER_KEY", "timeout_s": 5.0}
    pay = {"max_cost_usd": 1.0, "price_input_per_mtok": 2.0, "concurrency": 2, "batch_size": 1}
    teacher = _LLMLike()

    stats = annotate(
        make_config(**llm, **reach, **pay, max_retries=0),
        trajs,
        out,
        teacher=teacher,
        progress=False,
    )

    assert (stats["n_annotated"], stats["n_skipped_existing"]) == (8, 4)
    assert len(teacher.asked) == 8 and "set_aside" not in stats
    assert asides(tmp_path) == [] and len(rows_of(out)) == 12


def test_the_grounded_teacher_ignores_the_llm_sampling_settings(tmp_path) -> None:
    trajs = make_trajectories(2, 3)
    out = tmp_path / "annotations.jsonl"
    annotate(make_config(), trajs, out, progress=False)
    stats = annotate(make_config(temperature=0.9, max_tokens=8), trajs, out, progress=False)
    assert (stats["n_annotated"], stats["n_skipped_existing"]) == (0, 6)
    assert asides(tmp_path) == []


def test_annotations_without_a_record_keep_their_rows(tmp_path) -> None:
    trajs = make_trajectories(2, 3)
    out = tmp_path / "annotations.jsonl"
    annotate(make_config(history_len=2), trajs, out, progress=False)
    (tmp_path / SETTINGS).unlink()  # annotated before the settings were recorded
    before = out.read_bytes()

    stats = annotate(make_config(history_len=1), trajs, out, progress=False)

    assert (stats["n_annotated"], stats["n_skipped_existing"]) == (0, 6)
    assert out.read_bytes() == before and asides(tmp_path) == []
    assert json.loads((tmp_path / SETTINGS).read_text())["history_len"] == 1  # taken as theirs


def test_resume_false_sets_nothing_aside(tmp_path) -> None:
    trajs = make_trajectories(1, 2)
    out = tmp_path / "annotations.jsonl"
    annotate(make_config(history_len=2), trajs, out, progress=False)
    stats = annotate(make_config(history_len=0), trajs, out, progress=False, resume=False)
    assert stats["n_annotated"] == 2 and len(rows_of(out)) == 2
    assert asides(tmp_path) == [] and "set_aside" not in stats
    assert json.loads((tmp_path / SETTINGS).read_text())["history_len"] == 0


def _annotated_then_history_changed(tmp_path: Path, monkeypatch):
    """A project annotated by the stage, then its params changed (``history_len`` 0)."""
    without_tracking(monkeypatch)
    cfg, paths = make_project(tmp_path)
    write_jsonl(paths.trajectories_file, make_trajectories(3, 3))
    data_stage.annotate(cfg, paths)
    return load_config(write_params(tmp_path, {"teacher": {"history_len": 0}})), paths


def test_the_stage_keeps_the_record_with_a_fresh_run_s_rows(tmp_path, monkeypatch) -> None:
    cfg, paths = _annotated_then_history_changed(tmp_path, monkeypatch)

    data_stage.annotate(cfg, paths, fresh=True)  # written beside, then swapped in
    stats = data_stage.annotate(cfg, paths)

    folder = paths.annotations_file.parent
    assert (stats["n_annotated"], stats["n_skipped_existing"]) == (0, 9)
    assert asides(folder) == [] and not [p for p in folder.iterdir() if "fresh" in p.name]
    assert json.loads((folder / SETTINGS).read_text())["history_len"] == 0


def test_the_stage_sets_old_rows_aside_outside_its_dvc_output(tmp_path, monkeypatch) -> None:
    cfg, paths = _annotated_then_history_changed(tmp_path, monkeypatch)
    before = paths.annotations_file.read_bytes()

    stats = data_stage.annotate(cfg, paths)  # resumed under changed settings

    folder = paths.annotations_file.parent  # data/annotations: DVC hashes all it holds
    [aside] = asides(folder.parent)
    assert asides(folder) == [] and stats["set_aside"] == str(aside)
    assert aside.name.startswith(f"{folder.name}-aside-")
    assert (aside / "annotations.jsonl").read_bytes() == before
    assert (aside / ".gitignore").read_text() == "*\n"
    assert stats["n_annotated"] == 9
