"""Resumable annotation of real transitions with teacher reasoning traces.

Output: an append-only JSONL keyed by transition id, one line per annotated transition,
``{id, reasoning, backend, model, prompt_tokens, completion_tokens}``, flushed line by
line. A run killed at any point (even ``kill -9``) resumes where it stopped: a torn last
line (no trailing newline) is cut off, ids already present are skipped, nothing is
duplicated. Failures go to a separate JSONL (``<out>.failures.jsonl``: id, error,
attempts, excerpt of the bad answer) and are attempted again by the next run; items the
budget did not allow are written nowhere and are done by the next run as well.

Ids do not hash the teacher settings, so the settings that shape an annotation are recorded
beside the output (``<out>.settings.json``, see ``annotation_settings``). A resume that finds
other recorded settings moves the old annotations, their failures and their record to a
folder (``<out stem>-aside-<time>/`` beside the output; the stage's is
``data/annotations-aside-<time>/``, outside its DVC output; never read by the pipeline) and
annotates afresh; an output with no record (annotated before there were records) is resumed
as it is, under the current settings.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from components.config import Config, TeacherConfig
from components.io import atomic_write_text, read_settings_record, unused_stamped_dir
from components.schema import Trajectory
from components.teacher.base import (
    Annotation,
    AnnotationRequest,
    BudgetExhaustedError,
    Teacher,
    iter_requests,
)

log = logging.getLogger(__name__)

ANNOTATION_KEYS = ("id", "reasoning", "backend", "model", "prompt_tokens", "completion_tokens")
FAILURE_KEYS = (
    "id",
    "backend",
    "model",
    "error",
    "attempts",
    "raw",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
)


class AnnotationFileError(ValueError):
    """An annotation file has a corrupt line that is not a torn tail."""


def make_teacher(cfg: TeacherConfig) -> Teacher:
    """The teacher backend named by ``cfg.backend``."""
    if cfg.backend == "grounded":
        from components.teacher.grounded import GroundedTeacher

        return GroundedTeacher(concise=cfg.style == "concise")
    if cfg.backend == "openai":
        from components.teacher.openai_teacher import OpenAITeacher

        return OpenAITeacher(cfg)
    from components.teacher.hf_teacher import HFTeacher

    return HFTeacher(cfg)


def teacher_identity(cfg: TeacherConfig) -> tuple[str, str]:
    """The (backend, model) that ``make_teacher(cfg)`` stamps on its annotations."""
    # the grounded teacher names its own model (its trace version); cfg.model is for LLMs.
    # Comparing stored rows with (cfg.backend, cfg.model) would never match it and every
    # rerun would start over instead of resuming.
    if cfg.backend == "grounded":
        from components.teacher.grounded import GroundedTeacher

        return GroundedTeacher.backend, GroundedTeacher(concise=cfg.style == "concise").model
    return cfg.backend, cfg.model


def failures_path_for(out_path: Path) -> Path:
    """Default failures file next to the output: ``annotations.jsonl`` -> ``...failures.jsonl``."""
    return out_path.with_name(out_path.stem + ".failures.jsonl")


def settings_path_for(out_path: Path) -> Path:
    """The record of the settings the output was annotated under: ``...settings.json``."""
    return out_path.with_name(out_path.stem + ".settings.json")


# Teacher keys that do not change what an annotation says, only how the teacher is reached
# (base_url, api_key_env, timeout_s), retried (max_retries, backoff_*: a retry may turn a
# failure into an annotation, never change one), run in parallel (concurrency, batch_size)
# or paid for (max_cost_usd, price_*). Every other key counts, a new one by default.
NOT_ANNOTATION_KEYS = frozenset(
    {
        "base_url",
        "api_key_env",
        "timeout_s",
        "max_retries",
        "backoff_base_s",
        "backoff_max_s",
        "concurrency",
        "batch_size",
        "max_cost_usd",
        "price_input_per_mtok",
        "price_output_per_mtok",
    }
)
# Keys that name the teacher: recorded as the (backend, model) its rows are stamped with
# (``style`` is in the grounded teacher's model name; the LLM teachers do not read it).
IDENTITY_KEYS = frozenset({"backend", "model", "style"})
# Sampling keys only the LLM teachers read: the grounded teacher's traces ignore them.
LLM_ONLY_KEYS = frozenset({"max_tokens", "temperature"})


def annotation_settings(cfg: TeacherConfig, identity: tuple[str, str]) -> dict[str, Any]:
    """The settings that shape the annotations of the teacher stamping ``identity``:
    (backend, model) plus ``history_len`` and, for the LLM teachers, the sampling keys."""
    skip = NOT_ANNOTATION_KEYS | IDENTITY_KEYS
    if identity[0] == "grounded":
        skip |= LLM_ONLY_KEYS
    settings = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in skip}
    return {"backend": identity[0], "model": identity[1], **settings}


def check_settings(
    settings: dict[str, Any], out_path: Path, failures_path: Path, aside_in: Path | None = None
) -> Path | None:
    """Record ``settings`` beside ``out_path``; annotations (and failures) made under other
    recorded settings of the same teacher are moved to a new folder first (returned; None
    when nothing was moved): in ``aside_in``, named for ``out_path``'s folder and ignored by
    git, or beside ``out_path`` without it."""
    record = settings_path_for(out_path)
    old = read_settings_record(record)
    existing = any(True for _ in _scan(out_path, repair=False)) or any(
        True for _ in _scan(failures_path, repair=False)
    )
    # another teacher's rows are the resume logic's business (kept, with a warning); an
    # unreadable record ({}) says nothing, so its rows are set aside
    same_teacher = not old or (old.get("backend"), old.get("model")) == (
        settings["backend"],
        settings["model"],
    )
    aside = None
    if old is None and existing:
        log.info("annotate: %s records no teacher settings; taking the current ones", out_path)
    elif old is not None and old != settings and existing and same_teacher:
        if aside_in is None:
            aside = unused_stamped_dir(out_path.with_name(f"{out_path.stem}-aside-"))
        else:
            aside = unused_stamped_dir(Path(aside_in) / f"{out_path.parent.name}-aside-")
        aside.mkdir(parents=True)
        if aside_in is not None:  # beside a DVC output: git must not list it either
            (aside / ".gitignore").write_text("*\n", encoding="utf-8")
        # the annotations first: once they are moved nothing can resume them by mistake
        for src in (out_path, failures_path):
            if src.exists():
                shutil.move(src, aside / src.name)
        if record.exists():
            shutil.copyfile(record, aside / record.name)  # what they were annotated under
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        log.warning(
            "annotate: teacher settings changed since %s was annotated (%s): its annotations "
            "and failures are moved to %s; annotating afresh",
            out_path,
            ", ".join(changed) if old else "its record is unreadable",
            aside,
        )
    if old != settings:
        atomic_write_text(record, json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return aside


def _scan(path: Path, repair: bool) -> Iterator[dict[str, Any]]:
    """Complete JSON lines of ``path``; a torn tail is cut off (repair) or ignored."""
    if not path.exists():
        return
    offset = 0
    torn_at: int | None = None
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                torn_at = offset  # the writer died mid-line: only ever the last line
                break
            offset += len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise AnnotationFileError(
                    f"{path}:{lineno}: corrupt line (not a torn tail)"
                ) from None
            if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                raise AnnotationFileError(f"{path}:{lineno}: line has no string 'id'")
            yield row
    if torn_at is not None:
        if repair:
            log.warning("%s: dropping a torn last line (interrupted write)", path)
            with path.open("r+b") as f:
                f.truncate(torn_at)
        else:
            log.warning("%s: ignoring a torn last line", path)


def iter_annotations(path: Path) -> Iterator[dict[str, Any]]:
    """Annotation rows of a file, first occurrence of each id only (read-only)."""
    seen: set[str] = set()
    for row in _scan(Path(path), repair=False):
        if row["id"] not in seen:
            seen.add(row["id"])
            yield row


def load_annotations(path: Path) -> dict[str, str]:
    """Transition id -> reasoning, for building the experience model's SFT targets."""
    return {row["id"]: row["reasoning"] for row in iter_annotations(path)}


@dataclass
class _Tally:
    """Counters of one annotate() run."""

    annotated: int = 0
    failed: int = 0
    not_attempted: int = 0
    skipped_existing: int = 0
    duplicates: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


def _write_line(f: IO[str], row: dict[str, Any]) -> None:
    # One write + flush per line: a kill leaves at most one torn line, never a lost one.
    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    f.flush()


def _chunks(items: Iterable[AnnotationRequest], n: int) -> Iterator[list[AnnotationRequest]]:
    chunk: list[AnnotationRequest] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def annotate(
    cfg: Config,
    trajectories: Iterable[Trajectory],
    out_path: Path,
    teacher: Teacher | None = None,
    progress: bool = True,
    *,
    failures_path: Path | None = None,
    resume: bool = True,
    aside_in: Path | None = None,
) -> dict[str, Any]:
    """Annotate every transition not yet in ``out_path``; returns the run's stats.

    Rows of other teacher settings are set aside in ``aside_in`` (default: beside
    ``out_path``; the stage keeps them out of its DVC output folder)."""
    from components.progress import progress_bar

    start = time.monotonic()
    out_path = Path(out_path)
    failures_path = Path(failures_path) if failures_path else failures_path_for(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    failures_path.parent.mkdir(parents=True, exist_ok=True)
    if not resume:
        out_path.unlink(missing_ok=True)
        failures_path.unlink(missing_ok=True)
    # the (backend, model) the rows will be stamped with: the teacher is made further down
    identity = teacher_identity(cfg.teacher)
    if teacher is not None:
        identity = (teacher.backend, teacher.model)
    settings = annotation_settings(cfg.teacher, identity)
    aside = check_settings(settings, out_path, failures_path, aside_in)
    done: set[str] = set()
    producers: set[tuple[str, str]] = set()
    for row in _scan(out_path, repair=True):
        done.add(row["id"])
        producers.add((str(row.get("backend")), str(row.get("model"))))
    n_existing = len(done)
    for _ in _scan(failures_path, repair=True):
        pass  # only repairs a torn tail before appending
    own = teacher is None
    teacher = teacher if teacher is not None else make_teacher(cfg.teacher)
    others = producers - {(teacher.backend, teacher.model)}
    if others:
        # Kept, not redone: pass resume=False to re-annotate everything with this teacher.
        log.warning("%s already holds annotations by other teachers: %s", out_path, others)
    tally = _Tally()

    def exhausted() -> bool:
        return bool(getattr(teacher, "budget_exhausted", False))

    total = sum(len(t.steps) for t in trajectories) if isinstance(trajectories, Sequence) else None

    def todo() -> Iterator[AnnotationRequest]:
        seen: set[str] = set()
        for req in iter_requests(trajectories, cfg.teacher.history_len):
            if req.id in seen:
                tally.duplicates += 1
                bar.update(1)
            elif req.id in done:
                tally.skipped_existing += 1
                bar.update(1)
            else:
                seen.add(req.id)
                yield req

    try:
        with (
            out_path.open("a", encoding="utf-8") as out,
            failures_path.open("a", encoding="utf-8") as fail,
            progress_bar(
                total=total, desc=f"annotate[{teacher.backend}]", disable=not progress
            ) as bar,
        ):
            handled: set[str] = set()

            def record(ann: Annotation) -> None:
                if ann.id in handled:
                    return
                handled.add(ann.id)
                tally.prompt_tokens += ann.prompt_tokens
                tally.completion_tokens += ann.completion_tokens
                tally.cost_usd += ann.cost_usd
                if ann.status == "ok":
                    _write_line(out, {k: getattr(ann, k) for k in ANNOTATION_KEYS})
                    done.add(ann.id)
                    tally.annotated += 1
                elif ann.status == "failed":
                    _write_line(fail, {k: getattr(ann, k) for k in FAILURE_KEYS})
                    tally.failed += 1
                else:
                    tally.not_attempted += 1
                bar.update(1)
                bar.set_postfix(failed=tally.failed, usd=f"{tally.cost_usd:.4f}", refresh=False)

            for chunk in _chunks(todo(), max(1, teacher.batch_size)):
                for ann in teacher.annotate(chunk, on_result=record):
                    record(ann)  # for teachers that ignore on_result; no double count
                if exhausted():
                    break
    finally:
        if own and hasattr(teacher, "close"):
            teacher.close()
    stats: dict[str, Any] = {
        "backend": teacher.backend,
        "model": teacher.model,
        "n_annotated": tally.annotated,
        "n_skipped_existing": tally.skipped_existing,
        "n_failed": tally.failed,
        "n_not_attempted": tally.not_attempted,
        "n_duplicate_inputs": tally.duplicates,
        "n_total_annotated": len(done),
        "prompt_tokens": tally.prompt_tokens,
        "completion_tokens": tally.completion_tokens,
        "tokens": tally.prompt_tokens + tally.completion_tokens,
        "cost_usd": round(tally.cost_usd, 8),
        "seconds": round(time.monotonic() - start, 3),
        "budget_exhausted": exhausted(),
        "complete": not exhausted() and tally.failed == 0,
        "out_path": str(out_path),
        "failures_path": str(failures_path),
    }
    if aside is not None:
        stats["set_aside"] = str(aside)
    log.info(
        "annotate: %d new (%d already there), %d failed, %d tokens, $%.4f in %.1fs",
        tally.annotated,
        n_existing,
        tally.failed,
        stats["tokens"],
        tally.cost_usd,
        stats["seconds"],
    )
    if exhausted():
        raise BudgetExhaustedError(
            f"teacher budget max_cost_usd={cfg.teacher.max_cost_usd} reached "
            f"(spent ${tally.cost_usd:.4f} this run): {tally.annotated} transitions annotated, "
            f"the rest left for the next run (it resumes from {out_path})",
            stats,
        )
    return stats
