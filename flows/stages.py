"""Prefect tasks over DVC stages, and which family each stage belongs to.

Each stage runs as ``dvc repro <stage>``, so DVC decides what is stale and a rerun with
nothing changed does nothing. Stages that talk to external processes (simulators, APIs)
retry; training stages do not (a retry would only repeat a deterministic failure) and
are tagged ``accelerator`` so a Prefect tag concurrency limit serialises them
(``prefect concurrency-limit create accelerator 1``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from prefect import get_run_logger, task

from components.tracking import PARENT_RUN_ENV

ACCELERATOR_TAG = "accelerator"
# stages that talk to simulators or APIs: transient failures are worth a retry
IO_STAGES = frozenset({"generate_tasks", "collect", "annotate", "judge"})
# every dvc.yaml stage belongs to exactly one family (a test checks it)
FAMILIES: dict[str, tuple[str, ...]] = {
    "data": ("generate_tasks", "collect", "ingest", "build_buffer", "annotate"),
    "experience": ("train_experience_model", "evaluate_fidelity"),
    "agent": (
        "train_sft_policy",
        "train_dpo_policy",
        "train_rl_real",
        "train_dreamgym",
        "train_s2r",
        "evaluate_policy",
    ),
    "evaluation": ("table1", "judge", "drift", "report"),
}


def stage_order(root: Path) -> list[str]:
    """Stage names in dvc.yaml order (written topologically)."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    return list(spec["stages"])


def family_stages(root: Path, family: str) -> list[str]:
    """The dvc.yaml stages of one family, in pipeline order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    return [s for s in stage_order(root) if s in FAMILIES[family]]


def _repro(stage: str, root: str, parent_run_id: str | None, force: bool = False) -> None:
    logger = get_run_logger()
    env = dict(os.environ)
    if parent_run_id:
        env[PARENT_RUN_ENV] = parent_run_id
    cmd = ["dvc", "repro", stage] + (["--force", "--single-item"] if force else [])
    logger.info("$ %s", " ".join(cmd))
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        logger.info(line.rstrip())
    if proc.wait() != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}")


repro_io_stage = task(
    _repro, name="dvc-repro-io", retries=2, retry_delay_seconds=[10, 60], task_run_name="{stage}"
)
repro_compute_stage = task(
    _repro, name="dvc-repro", retries=0, tags=[ACCELERATOR_TAG], task_run_name="{stage}"
)


def run_stages(stages: list[str], root: Path, parent_run_id: str | None, force: bool) -> None:
    """Run stages in order, each with the retry policy of its kind."""
    for stage in stages:
        runner = repro_io_stage if stage in IO_STAGES else repro_compute_stage
        runner(stage, str(root), parent_run_id, force)
