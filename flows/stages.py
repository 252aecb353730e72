"""Prefect tasks over DVC stages, which family each stage belongs to, and their order.

Each stage runs as ``dvc repro <stage>``, so DVC decides what is stale and a rerun with
nothing changed does nothing. Only the I/O-bound stages retry (``IO_STAGES``: task
generation and collection from the envs; teacher annotation and the judge when an API
answers them, ``is_io_bound``; an env server or API may fail for a moment). Every other
stage is compute-bound and never retries (a retry would only repeat a deterministic
failure): training, and the evaluation stages that run the policies and the experience
model on the real simulators (``evaluate_random``, ``evaluate_policy``, ``theorem1``,
``policy_fidelity``) alike. Those stages are tagged
``accelerator``, so a Prefect tag concurrency limit serialises them
(``prefect concurrency-limit create accelerator 1``): with it, only the I/O stages of
several env pipelines overlap.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger, task

from components.cli_process import EXIT_BUDGET, EXIT_CONFIG
from components.config import PARAMS_FILE, Config, load_config
from components.tracking import PARENT_RUN_ENV

ACCELERATOR_TAG = "accelerator"
DVC_FILE = "dvc.yaml"
# I/O-bound stages (env servers, the teacher's or judge's API): a transient failure is worth
# a retry. theorem1 and policy_fidelity are not: they run local policies and the experience
# model on the simulators (the grounded judge's replay), compute-bound like evaluate_policy
IO_STAGES = frozenset({"generate_tasks", "collect", "annotate", "judge"})
# the stages that call the teacher or the judge, by config section: I/O-bound only with an
# API behind them; the grounded (and hf) backends compute in the stage's own process
API_STAGES = {"annotate": "teacher", "judge": "judge"}
API_BACKEND = "openai"
# every dvc.yaml stage belongs to exactly one family (a test checks it)
FAMILIES: dict[str, tuple[str, ...]] = {
    "data": ("generate_tasks", "collect", "ingest", "build_buffer", "annotate"),
    "experience": ("train_experience_model", "evaluate_fidelity"),
    "agent": (
        "train_sft",
        "train_dpo",
        "train_rl_real",
        "train_dreamgym",
        "train_s2r",
        "evaluate_random",
        "evaluate_policy",
    ),
    "evaluation": ("table1", "judge", "drift", "theorem1", "policy_fidelity", "report"),
}
_PRODUCED = ("outs", "metrics", "plots")


def _paths(entries: Iterable[Any] | None, item: Any) -> list[str]:
    """Paths of a deps/outs list (plain strings or ``{path: options}``), ``${item}`` filled."""
    out = []
    for entry in entries or ():
        for path in entry if isinstance(entry, Mapping) else (entry,):
            text = str(path)
            if item is not None:
                text = text.replace("${item}", str(item))
            out.append(text.rstrip("/"))
    return out


def _stage_io(stage: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(deps, produced paths) of one stage, foreach items expanded."""
    body = stage.get("do", stage)
    items = stage.get("foreach")
    items = list(items) if isinstance(items, list | Mapping) else [None]
    deps: set[str] = set()
    made: set[str] = set()
    for item in items:
        deps.update(_paths(body.get("deps"), item))
        for key in _PRODUCED:
            made.update(_paths(body.get(key), item))
    return deps, made


def _overlaps(dep: str, out: str) -> bool:
    # DVC links a dep to an out when either path contains the other
    return dep == out or dep.startswith(out + "/") or out.startswith(dep + "/")


def _upstream(root: Path) -> tuple[list[str], dict[str, set[str]]]:
    """dvc.yaml's stages (file order) and, per stage, the stages producing its deps."""
    spec = yaml.safe_load((root / DVC_FILE).read_text(encoding="utf-8"))
    stages: dict[str, Any] = spec.get("stages") or {}
    io = {name: _stage_io(stage) for name, stage in stages.items()}
    upstream = {
        name: {
            other
            for other, (_, made) in io.items()
            if other != name and any(_overlaps(d, o) for d in deps for o in made)
        }
        for name, (deps, _) in io.items()
    }
    return list(stages), upstream


def stage_order(root: Path) -> list[str]:
    """dvc.yaml stages in dependency order (upstream first; dvc.yaml order where free)."""
    stages, upstream = _upstream(root)
    order: list[str] = []
    while len(order) < len(stages):
        ready = next(
            (s for s in stages if s not in order and upstream[s] <= set(order)),
            None,
        )
        if ready is None:
            left = sorted(set(stages) - set(order))
            raise ValueError(f"dependency cycle among dvc.yaml stages {left}")
        order.append(ready)
    return order


def with_upstream(root: Path, stages: Sequence[str]) -> list[str]:
    """``stages`` and every stage upstream of them, in pipeline order. Each then runs as
    its own task under its own retry policy: a plain ``dvc repro <stage>`` would run the
    stale upstream stages inside the task of ``<stage>`` (a training stage retried as I/O)."""
    _, upstream = _upstream(root)
    wanted, todo = set(stages), list(stages)
    while todo:
        for parent in upstream.get(todo.pop(), ()):
            if parent not in wanted:
                wanted.add(parent)
                todo.append(parent)
    return [s for s in stage_order(root) if s in wanted]


def family_stages(root: Path, family: str) -> list[str]:
    """The dvc.yaml stages of one family, in pipeline order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    return [s for s in stage_order(root) if s in FAMILIES[family]]


def repro_command(stage: str, force: bool) -> list[str]:
    """The ``dvc repro`` call of one stage (forced: only that stage, upstream untouched)."""
    # the interpreter running the flow, not whatever `dvc` is on a worker's PATH
    extra = ["--force", "--single-item"] if force else []
    return [sys.executable, "-m", "dvc", "repro", *extra, stage]


def stage_env(parent_run_id: str | None, root: str | Path | None = None) -> dict[str, str]:
    """The stage's environment: the venv's scripts first on PATH, the MLflow parent run, and
    ``root`` first on PYTHONPATH (a per-env workspace runs its own checkout's code, not the
    editable install's)."""
    env = dict(os.environ)
    # DVC stages call `dreamgym`: a worker started without the venv activated must find it
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    if root is not None:
        paths = [str(Path(root).resolve()), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if parent_run_id:
        env[PARENT_RUN_ENV] = parent_run_id
    return env


def stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``proc`` and every process under it: `dvc repro`, the shell it starts and the
    stage command (killing `dvc repro` alone left the stage running, writing outputs, under
    PID 1). SIGTERM first, so a stage can drop its partial outputs; SIGKILL after
    ``grace_s``. (The stage stays in our process group: Ctrl-C in a terminal reaches it
    directly, even when a worker thread runs this task.)"""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]  # listed before any of them exits
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()


def _repro(stage: str, root: str, parent_run_id: str | None, force: bool = False) -> None:
    logger = get_run_logger()
    cmd = repro_command(stage, force)
    logger.info("$ %s", " ".join(cmd[2:]))
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env=stage_env(parent_run_id, root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",  # a stage's non-UTF-8 output byte must not fail the task
    )
    assert proc.stdout is not None
    command_exit: int | None = None
    try:
        for line in proc.stdout:
            logger.info(line.rstrip())
            if found := _COMMAND_EXIT.search(line):
                command_exit = int(found.group(1))
    except BaseException:  # never leave `dvc repro` running (holding its lock) behind it
        stop_tree(proc)
        raise
    if proc.wait() != 0:
        raise StageFailed(stage, proc.returncode, command_exit)


class StageFailed(RuntimeError):
    """`dvc repro <stage>` failed; ``command_exit`` is the stage command's own exit code
    (DVC exits 255 whatever the command did), None where DVC itself failed."""

    def __init__(self, stage: str, returncode: int, command_exit: int | None) -> None:
        why = f", its command exited with {command_exit}" if command_exit is not None else ""
        super().__init__(f"`dvc repro {stage}` failed with exit code {returncode}{why}")
        self.stage, self.returncode, self.command_exit = stage, returncode, command_exit

    def __reduce__(self) -> tuple[Any, ...]:
        # a Dask worker sends it back pickled: rebuilt from its own arguments, not args
        return type(self), (self.stage, self.returncode, self.command_exit)


# DVC's last word on a failed command: "... failed to run: <cmd>, exited with 2"
_COMMAND_EXIT = re.compile(r"exited with (-?\d+)\s*$")
# a bad parameter (2) or a spent cost budget (3) fails the same way again: no retry
NOT_RETRIED = (EXIT_CONFIG, EXIT_BUDGET)


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: retry unless the stage command failed deterministically."""
    err = state.data
    return not (isinstance(err, StageFailed) and err.command_exit in NOT_RETRIED)


repro_io_stage = task(
    _repro,
    name="dvc-repro-io",
    retries=2,
    retry_delay_seconds=[10, 60],
    retry_condition_fn=retry_transient,
    task_run_name="{stage}",
)
repro_compute_stage = task(
    _repro, name="dvc-repro", retries=0, tags=[ACCELERATOR_TAG], task_run_name="{stage}"
)


def is_io_bound(stage: str, config: Config | None = None) -> bool:
    """Whether ``stage`` waits on I/O: an env, or (under ``config``) its teacher's or judge's
    API; without a config annotate and judge count as API-backed."""
    if stage in API_STAGES and config is not None:
        return getattr(config, API_STAGES[stage]).backend == API_BACKEND
    return stage in IO_STAGES


def stage_task(stage: str, config: Config | None = None) -> Any:
    """The task that runs ``stage``: retried if it is I/O-bound, else tagged ``accelerator``."""
    return repro_io_stage if is_io_bound(stage, config) else repro_compute_stage


def run_stages(stages: list[str], root: Path, parent_run_id: str | None, force: bool) -> None:
    """Run stages in order, each with the retry policy of its kind under root's params."""
    config = load_config(root / PARAMS_FILE)
    for stage in stages:
        stage_task(stage, config)(stage, str(root), parent_run_id, force)
