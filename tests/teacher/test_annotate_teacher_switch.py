"""Switching the teacher never costs the old annotations before the new ones replace them."""

from __future__ import annotations

import json
from importlib import import_module
from pathlib import Path

import pytest

from components.config import load_config
from components.schema import write_jsonl
from components.stages import data as data_stage
from components.teacher import Annotation, GroundedTeacher, TeacherError, failures_path_for
from tests.reliability.project import (
    KEY_ENV,
    make_project,
    make_trajectories,
    openai_teacher,
    without_tracking,
    write_params,
)

pytestmark = pytest.mark.timeout(120)
annotate_mod = import_module(
    "components.teacher.annotate"
)  # the package re-exports a function of that name


@pytest.fixture
def project(tmp_path: Path, monkeypatch):
    """A project annotated once by the grounded teacher: (root, paths, annotation bytes)."""
    without_tracking(monkeypatch)
    monkeypatch.setenv(KEY_ENV, "the-right-key")
    cfg, paths = make_project(tmp_path)
    write_jsonl(paths.trajectories_file, make_trajectories(6, steps=3))
    first = data_stage.annotate(cfg, paths)
    assert first["n_annotated"] > 0 and first["backend"] == "grounded"
    return tmp_path, paths, paths.annotations_file.read_bytes()


def _leftovers(paths) -> list[str]:
    return sorted(p.name for p in paths.annotations_file.parent.iterdir() if "fresh" in p.name)


def test_a_refused_new_teacher_keeps_the_old_annotations(project, fake_openai) -> None:
    root, paths, before = project
    refusing = fake_openai(api_key="another-key")  # every request: HTTP 401
    cfg = load_config(write_params(root, openai_teacher(refusing.base_url)))

    with pytest.raises(TeacherError, match="401"):
        data_stage.annotate(cfg, paths)

    assert paths.annotations_file.read_bytes() == before
    assert _leftovers(paths) == []  # nothing paid for: nothing kept aside


def test_the_new_teacher_replaces_the_old_rows_once_it_finished(project, fake_openai) -> None:
    root, paths, before = project
    n_rows = before.count(b"\n")
    server = fake_openai(api_key="the-right-key")
    cfg = load_config(write_params(root, openai_teacher(server.base_url)))

    stats = data_stage.annotate(cfg, paths)

    rows = [json.loads(x) for x in paths.annotations_file.read_text().splitlines()]
    assert len(rows) == n_rows == stats["n_total_annotated"]
    assert {r["backend"] for r in rows} == {"openai"}
    assert stats["out_path"] == str(paths.annotations_file)
    assert failures_path_for(paths.annotations_file).read_text() == ""  # the new run's
    assert _leftovers(paths) == []


class _OpenAILike(GroundedTeacher):
    """Grounded answers stamped as the configured openai teacher; stops after ``n_ok``."""

    backend = "openai"

    def __init__(self, n_ok: int | None = None) -> None:
        super().__init__(batch_size=2)
        self.model = "gpt-4o"
        self.left = n_ok
        self.asked: list[str] = []

    def annotate(self, batch, on_result=None):
        out = []
        for req in batch:
            if self.left == 0:
                raise TeacherError("teacher request refused, HTTP 401")
            self.left = None if self.left is None else self.left - 1
            self.asked.append(req.id)
            out += super().annotate([req], on_result)
        return out


def test_a_new_teacher_stopped_part_way_is_resumed_then_swapped(
    project, fake_openai, monkeypatch
) -> None:
    root, paths, before = project
    n_rows = before.count(b"\n")
    cfg = load_config(write_params(root, openai_teacher("http://127.0.0.1:9/v1")))
    monkeypatch.setattr(annotate_mod, "make_teacher", lambda _cfg: _OpenAILike(n_ok=3))

    with pytest.raises(TeacherError):
        data_stage.annotate(cfg, paths)
    assert paths.annotations_file.read_bytes() == before  # the old rows are still in use
    # the 3 paid rows are kept aside for the next run
    assert _leftovers(paths) == [
        "annotations.fresh.failures.jsonl",
        "annotations.fresh.jsonl",
        "annotations.fresh.settings.json",  # the settings they were annotated under
    ]
    assert paths.annotations_file.with_name("annotations.fresh.jsonl").read_text().count("\n") == 3

    healthy = _OpenAILike()
    monkeypatch.setattr(annotate_mod, "make_teacher", lambda _cfg: healthy)
    stats = data_stage.annotate(cfg, paths)

    assert len(healthy.asked) == n_rows - 3 == stats["n_annotated"]  # nothing paid twice
    rows = [json.loads(x) for x in paths.annotations_file.read_text().splitlines()]
    assert len(rows) == n_rows and {r["backend"] for r in rows} == {"openai"}
    assert _leftovers(paths) == []


class _Unavailable(_OpenAILike):
    """Answers every request with a failed row (a server giving 503 to every retry)."""

    def annotate(self, batch, on_result=None):
        out = []
        for req in batch:
            row = Annotation(
                id=req.id, status="failed", backend=self.backend, model=self.model, error="503"
            )
            if on_result is not None:
                on_result(row)
            out.append(row)
        return out


def test_a_few_resumed_rows_never_replace_the_whole_old_set(project, monkeypatch) -> None:
    root, paths, before = project
    cfg = load_config(write_params(root, openai_teacher("http://127.0.0.1:9/v1")))
    monkeypatch.setattr(annotate_mod, "make_teacher", lambda _cfg: _OpenAILike(n_ok=3))
    with pytest.raises(TeacherError):
        data_stage.annotate(cfg, paths)
    monkeypatch.setattr(annotate_mod, "make_teacher", lambda _cfg: _Unavailable())

    stats = data_stage.annotate(cfg, paths)  # resumes the 3 rows; every other one fails

    assert stats["n_total_annotated"] == 3 and stats["n_failed"] == before.count(b"\n") - 3
    assert paths.annotations_file.read_bytes() == before  # the whole old set stays in use
    fresh = paths.annotations_file.with_name("annotations.fresh.jsonl")
    assert fresh.read_text().count("\n") == 3  # the paid rows wait for the next run


def test_fresh_discards_an_unfinished_fresh_run_even_with_no_old_annotations(
    project, monkeypatch
) -> None:
    root, paths, _ = project
    cfg = load_config(write_params(root, openai_teacher("http://127.0.0.1:9/v1")))
    monkeypatch.setattr(annotate_mod, "make_teacher", lambda _cfg: _OpenAILike(n_ok=3))
    with pytest.raises(TeacherError):
        data_stage.annotate(cfg, paths)
    paths.annotations_file.unlink()
    healthy = _OpenAILike()
    monkeypatch.setattr(annotate_mod, "make_teacher", lambda _cfg: healthy)

    data_stage.annotate(cfg, paths, fresh=True)

    assert _leftovers(paths) == []  # a later plain run would resume (and pay for) it again
