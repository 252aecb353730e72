"""Throwaway DreamGym projects and subprocess helpers for the reliability suite.

A project is a temp root with its own ``params.yaml`` (the repository's, switched to the
ci profile, with overrides), a task suite, raw trajectories and everything the stages
write (data/, metrics/, mlflow.db, mlruns/). Subprocesses run the real CLI or a python
snippet against it, so kill -9 lands on the real code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from components.config import Config, Paths, _deep_merge, load_config
from components.schema import Task, Trajectory, write_jsonl
from tests.factories import make_trajectory

ROOT = Path(__file__).resolve().parents[2]
TASK_IDS = ("tw-quest-0", "tw-quest-1")
KEY_ENV = "DREAMGYM_RELIABILITY_KEY"  # the variable the suite's openai teachers read
TEACHER_CONCURRENCY = 2


def make_tasks() -> list[Task]:
    """The tasks ``make_trajectory`` refers to (one train, one validation game)."""
    return [
        Task(
            task_id=tid,
            env="textworld",
            family="quest",
            difficulty=1,
            split=split,
            instruction="Find the key and open the chest.",
            seed=i,
        )
        for i, (tid, split) in enumerate(zip(TASK_IDS, ("train", "validation"), strict=True))
    ]


def make_trajectories(n: int, steps: int = 4, start: int = 0) -> list[Trajectory]:
    """``n`` valid trajectories over the project's tasks (every 4th on the validation game)."""
    out = []
    for i in range(start, start + n):
        val = i % 4 == 3
        out.append(
            make_trajectory(
                n_steps=1 + i % steps,
                success=i % 3 != 0,
                task_id=TASK_IDS[int(val)],
                policy=("expert", "noisy", "random")[i % 3],
                idx=i,
                split="validation" if val else "train",
            )
        )
    return out


def write_params(root: Path, overrides: Mapping[str, Any] | None = None) -> Path:
    """The repository's params.yaml on the ci profile, ``overrides`` merged into its overlay."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["profile"] = "ci"
    params["profiles"]["ci"] = _deep_merge(
        params["profiles"].get("ci") or {}, dict(overrides or {})
    )
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def make_project(
    root: Path,
    trajectories: Sequence[Trajectory] = (),
    overrides: Mapping[str, Any] | None = None,
) -> tuple[Config, Paths]:
    """A project at ``root``: params.yaml, tasks and raw trajectories; (config, paths)."""
    root.mkdir(parents=True, exist_ok=True)
    params = write_params(root, overrides)
    paths = Paths(root)
    write_jsonl(paths.tasks_file, make_tasks())
    if trajectories:
        write_jsonl(paths.raw / "collected.jsonl", trajectories)
    return load_config(params), paths


def openai_teacher(base_url: str) -> dict:
    """params.yaml overrides: the openai teacher on a local server, test-sized limits."""
    return {
        "teacher": {
            "backend": "openai",
            "model": "gpt-4o",
            "base_url": base_url,
            "api_key_env": KEY_ENV,
            "concurrency": TEACHER_CONCURRENCY,
            "max_retries": 2,
            "timeout_s": 10.0,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "max_tokens": 64,
        }
    }


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this one, offline, the repo importable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.update(extra or {})
    return env


def cli_args(root: Path, command: str, *args: str) -> list[str]:
    """argv of ``dreamgym <command>`` on the project at ``root``."""
    return [
        sys.executable,
        "-m",
        "components.cli",
        command,
        "--params",
        str(root / "params.yaml"),
        "--root",
        str(root),
        *args,
    ]


def spawn(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a child with stdout+stderr captured to ``log`` (read it after it ended)."""
    out = log.open("wb")
    try:
        return subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=out, stderr=out)
    finally:
        out.close()  # the child holds its own descriptor


def python_argv(code: str, *args: str) -> list[str]:
    """argv running a python snippet."""
    return [sys.executable, "-c", code, *args]


def wait_until(
    predicate: Callable[[], bool],
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 120,
    what: str = "condition",
) -> None:
    """Poll ``predicate``; fails if ``proc`` exits first or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` (the process we started, by its pid) and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def count_lines(path: Path) -> int:
    """Complete lines of a file (0 when missing)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def files_under(root: Path) -> list[Path]:
    """Every regular file below ``root``."""
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def complete_ids(path: Path) -> list[str]:
    """The ``id`` of every complete (newline-terminated) JSONL line; a torn tail is ignored."""
    lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    return [json.loads(line)["id"] for line in lines if line.strip()]


def last_json(text: str) -> dict[str, Any]:
    """The last pretty-printed JSON object of a CLI's output (its summary)."""
    start = text.rfind("\n{\n") + 1 if "\n{\n" in text else text.index("{\n")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


class NoTracking:
    """Stands in for the MLflow run of a stage (``stage_run``): for tests about files and
    errors, where a project's first MLflow database would cost seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> NoTracking:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def without_tracking(monkeypatch: Any) -> None:
    """Run the stages with ``NoTracking`` (``monkeypatch``: pytest's fixture)."""
    import components.tracking

    monkeypatch.setattr(components.tracking, "stage_run", NoTracking)
