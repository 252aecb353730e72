"""Data stages: task generation, real collection, validated ingestion, annotation.

Heavy imports stay inside the functions so ``dreamgym --help`` stays fast.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.io import InputError, output_lock
from components.schema import Task, Trajectory, read_jsonl
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")

DATA_METRICS = "data.json"
# a fresh annotate run's file beside annotations.jsonl until it replaces it
FRESH_SUFFIX = ".fresh.jsonl"


def load_tasks(paths: Paths) -> list[Task]:
    """The generated task suite (raises with a hint when it is missing)."""
    if not paths.tasks_file.exists():
        raise FileNotFoundError(f"{paths.tasks_file} missing: run `dreamgym generate-tasks`")
    tasks = list(read_jsonl(paths.tasks_file, Task))
    if not tasks:
        raise InputError(f"{paths.tasks_file} holds no task: run `dreamgym generate-tasks`")
    return tasks


def generate_tasks(cfg: Config, paths: Paths, force: bool = False) -> dict[str, Any]:
    """Stage generate_tasks: the task suite of ``cfg.env.name`` plus the user's external
    tasks (``tasks.external``) under data/tasks; a task list it did not write needs ``force``."""
    from components import manifest
    from components.envs import generate_task_suite
    from components.envs.base import TASKS_FILE, write_task_suite
    from components.envs.external import (
        QUARANTINE_FILE,
        load_external,
        merge_tasks,
        quarantine_text,
    )
    from components.io import atomic_write_text
    from components.tracking import stage_run

    # a missing folder or a foreign tasks.jsonl fails now, before slow generation
    external = load_external(cfg.tasks.external, cfg.env.name, paths.root)
    paths.tasks.mkdir(parents=True, exist_ok=True)
    outputs = (TASKS_FILE, QUARANTINE_FILE)
    if not manifest.read_manifest(paths.tasks) and _written_by_generator(paths.tasks_file):
        manifest.record(paths.tasks, [TASKS_FILE])  # from before the manifest existed
    manifest.claim(paths.tasks, outputs, force=force, what="`dreamgym generate-tasks`")
    with stage_run("generate_tasks", "data", cfg, ("env", "tasks"), paths.root) as run:
        start = time.perf_counter()
        tasks = generate_task_suite(cfg, paths.tasks, root=paths.root)
        if cfg.tasks.external.games or cfg.tasks.external.task_lists:
            tasks = merge_tasks(tasks, external)
            write_task_suite(paths.tasks, tasks)
        atomic_write_text(paths.tasks / QUARANTINE_FILE, quarantine_text(external.quarantined))
        manifest.record(paths.tasks, outputs)
        summary = _task_counts(tasks)
        summary["n_external"] = sum(t.external for t in tasks)
        summary["n_external_quarantined"] = len(external.quarantined)
        summary["seconds"] = round(time.perf_counter() - start, 2)
        run.log_metrics(summary)
        run.log_artifact(paths.tasks_file, "tasks")
    if external.quarantined:
        log.warning(
            "%d external games or lines quarantined (reasons in %s)",
            len(external.quarantined),
            paths.tasks / QUARANTINE_FILE,
        )
    log.info("generated %d tasks: %s", len(tasks), summary["n_games"])
    return summary


def _written_by_generator(tasks_file: Path) -> bool:
    """A task list from before the manifest: every row a generated TextWorld game whose
    ``.meta.json`` (only the generator writes one) lies beside its game file."""
    from components.envs.textworld_tasks import GAMES_DIR, META_SUFFIX

    if not tasks_file.is_file():
        return False
    try:
        tasks = list(read_jsonl(tasks_file, Task))
    except Exception:  # not even our schema: certainly not ours
        return False
    root = tasks_file.parent
    return bool(tasks) and all(
        t.game_file and (root / GAMES_DIR / f"{t.task_id}{META_SUFFIX}").is_file() for t in tasks
    )


def _task_counts(tasks: list[Task]) -> dict[str, Any]:
    by_split = Counter(t.split for t in tasks)
    by_family: dict[str, Counter[str]] = defaultdict(Counter)
    for t in tasks:
        by_family[t.family][t.split] += 1
    return {
        "n_games": {s: by_split.get(s, 0) for s in ("train", "validation", "test")},
        "n_games_per_family": {f: dict(c) for f, c in sorted(by_family.items())},
    }


def collect(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage collect: real trajectories from expert/noisy/random policies under data/raw."""
    from components.data.collect import collect as collect_trajectories
    from components.tracking import stage_run

    tasks = load_tasks(paths)
    sections = ("env", "collect")
    # a second collect on the same data/raw would play and append every episode again
    with (
        output_lock(paths.raw, command="collect"),
        stage_run("collect", "data", cfg, sections, paths.root, {"tasks": paths.tasks}) as run,
    ):
        summary = collect_trajectories(cfg, tasks, paths.raw, paths.root)
        run.log_metrics(summary)
    log.info(
        "collected %d trajectories, %d transitions",
        summary["n_trajectories"],
        summary["n_transitions"],
    )
    return summary


def ingest(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage ingest: validate raw trajectories (GX, the task suite), quarantine bad rows."""
    from components.data.ingest import REPORT_FILE, VALIDATION_FILE, check_inputs
    from components.data.ingest import ingest as ingest_files
    from components.tracking import stage_run

    raw_files = sorted(paths.raw.rglob("*.jsonl"))
    if not raw_files:
        raise FileNotFoundError(f"no *.jsonl under {paths.raw}: run `dreamgym collect` first")
    check_inputs(raw_files)  # a folder named x.jsonl: fail before any run is recorded
    # rows are checked against the suite: a test game's row labelled "train" would
    # otherwise reach the buffer and SFT (a missing suite fails before anything is written)
    tasks = load_tasks(paths)
    data = {"raw": paths.raw, "tasks": paths.tasks}
    with (
        output_lock(paths.ingested, paths.quarantine, command="ingest"),
        stage_run("ingest", "data", cfg, ("ingest",), paths.root, data) as run,
    ):
        report = ingest_files(raw_files, paths.ingested, paths.quarantine, cfg.ingest, tasks)
        metrics = data_metrics(tasks, paths.trajectories_file, report.n_quarantined)
        write_json(paths.metrics / DATA_METRICS, metrics)
        run.log_metrics({**metrics, "n_lines": report.n_lines})
        run.log_dict(report.validation, "great_expectations/validation.json")
        run.log_artifact(paths.quarantine / REPORT_FILE, "quarantine")
        run.log_artifact(paths.ingested / VALIDATION_FILE, "great_expectations")
        run.set_tags({"gx.success": report.validation.get("success")})
    if report.n_quarantined:
        log.warning(
            "%d of %d lines quarantined (see %s): %s",
            report.n_quarantined,
            report.n_lines,
            paths.quarantine,
            report.reasons,
        )
    log.info("ingested %d trajectories, %d transitions", report.n_ingested, report.n_transitions)
    return metrics


def data_metrics(tasks: list[Task], trajectories_file: Path, n_quarantined: int) -> dict[str, Any]:
    """The metrics/data.json contract: games per split, sizes, success per policy."""
    n_traj = 0
    n_steps = 0
    runs: dict[str, list[int]] = defaultdict(list)
    for traj in read_jsonl(trajectories_file, Trajectory):
        n_traj += 1
        n_steps += traj.n_steps
        runs[traj.policy].append(int(traj.success))
    counts = _task_counts(tasks)
    return {
        "n_games": counts["n_games"],
        "n_trajectories": n_traj,
        "n_transitions": n_steps,
        "success_rate": {p: round(sum(v) / len(v), 4) for p, v in sorted(runs.items())},
        "n_trajectories_per_policy": {p: len(v) for p, v in sorted(runs.items())},
        "n_quarantined": n_quarantined,
    }


def annotate(cfg: Config, paths: Paths, fresh: bool = False) -> dict[str, Any]:
    """Stage annotate: a teacher reasoning trace for every ingested real transition."""
    from components.teacher.annotate import teacher_identity

    if not paths.trajectories_file.exists():  # before the lock: it would create data/
        raise FileNotFoundError(f"{paths.trajectories_file} missing: run `dreamgym ingest`")
    # held for the whole stage: two annotate runs would both append the same ids
    with output_lock(paths.annotations_file.parent, command="annotate"):
        return _annotate(cfg, paths, fresh, teacher_identity(cfg.teacher))


def _annotate(cfg: Config, paths: Paths, fresh: bool, wanted: tuple[str, str]) -> dict[str, Any]:
    from components.teacher.annotate import annotate as annotate_transitions
    from components.teacher.annotate import failures_path_for, iter_annotations, settings_path_for
    from components.tracking import stage_run

    def teachers(path: Path) -> set[tuple[str, str]]:
        return {(str(r.get("backend")), str(r.get("model"))) for r in iter_annotations(path)}

    out = paths.annotations_file
    work = out.with_name(out.stem + FRESH_SUFFIX)
    old_rows = list(iter_annotations(out))
    producers = {(str(r.get("backend")), str(r.get("model"))) for r in old_rows}
    n_old = len({r.get("id") for r in old_rows})
    # A fresh start writes beside the old annotations and replaces them only when it ends:
    # a run that fails (a refused key, a crash, the budget) loses none of the old rows.
    if fresh:  # discards an unfinished fresh run too: it would be resumed later
        work.unlink(missing_ok=True)
        failures_path_for(work).unlink(missing_ok=True)
        settings_path_for(work).unlink(missing_ok=True)
        target, resume = (work if producers else out), False
    elif teachers(work) == {wanted}:
        # a fresh start by this teacher that stopped part way: its paid rows are resumed
        log.warning("resuming the unfinished fresh annotation run in %s", work)
        target, resume = work, True
    elif producers and producers != {wanted}:
        # resuming is for the same teacher; a new teacher starts over rather than mixing
        log.warning("annotations by %s, config asks for %s: starting fresh", producers, wanted)
        target, resume = work, False
    else:
        target, resume = out, True
    trajectories = list(read_jsonl(paths.trajectories_file, Trajectory))
    data = {"trajectories": paths.trajectories_file}
    with stage_run("annotate", "experience", cfg, ("teacher",), paths.root, data) as run:
        try:
            # old settings' rows go beside data/annotations: inside, DVC would cache them
            aside_in = out.parent.parent
            stats = annotate_transitions(
                cfg, trajectories, target, resume=resume, aside_in=aside_in
            )
        except BaseException:
            if target == work:
                _drop_if_empty(work, failures_path_for(work))
            raise
        run.log_metrics(stats)
        # the new teacher's rows replace the old ones once they are all there, or at least
        # as many: a few resumed rows must never replace a whole set (all else failing)
        if target == work and (stats["complete"] or stats["n_total_annotated"] >= n_old):
            _replace_annotations(work, out)
            stats.update(out_path=str(out), failures_path=str(failures_path_for(out)))
        elif target == work:  # keep the old teacher's rows in use; the new ones aside
            log.warning(
                "the new teacher has annotated %d transitions (%d failed in this run), the "
                "old %d: %s keeps the old annotations; rerun to resume the new teacher "
                "(or delete %s to use the new rows as they are)",
                stats["n_total_annotated"],
                stats["n_failed"],
                n_old,
                out,
                out.name,
            )
            if failures_path_for(work).exists():
                run.log_artifact(failures_path_for(work), "annotation_failures")
            _drop_if_empty(work, failures_path_for(work))
        failures = failures_path_for(out)
        if failures.exists() and failures.stat().st_size:
            run.log_artifact(failures, "annotation_failures")
    write_json(paths.metrics / "annotate.json", numbers(stats))
    return stats


def _drop_if_empty(work: Path, failures: Path) -> None:
    """Remove a fresh run's files when it annotated nothing (nothing paid for to resume)."""
    from components.teacher.annotate import settings_path_for

    if not work.exists() or not work.stat().st_size:
        work.unlink(missing_ok=True)
        failures.unlink(missing_ok=True)
        settings_path_for(work).unlink(missing_ok=True)


def _replace_annotations(work: Path, out: Path) -> None:
    """A finished fresh run's files replace the annotations and their failures atomically."""
    import os

    from components.io import _fsync_path
    from components.teacher.annotate import failures_path_for, settings_path_for

    # the settings record and the failures first, the annotations last: the annotations'
    # rename is the commit, and until it the fresh run can still be resumed from ``work``
    moves = [(f(work), f(out)) for f in (settings_path_for, failures_path_for)]
    for src, dst in (*moves, (work, out)):
        if src.exists():
            _fsync_path(src)
            os.replace(src, dst)
        else:
            dst.unlink(missing_ok=True)  # the old teacher's failures are not the new one's
    _fsync_path(out.parent, directory=True)
