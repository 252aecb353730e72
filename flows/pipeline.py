"""The ``pipeline`` flow: run the DVC stages in order under one MLflow parent run.

Each stage runs as ``dvc repro <stage>``, so DVC decides what is stale and a rerun with
nothing changed does nothing. Stages that talk to external processes (simulators, APIs)
retry; training stages do not (a retry would only repeat a deterministic failure) and
are tagged ``accelerator`` so a Prefect concurrency limit can serialise them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from prefect import flow, get_run_logger, task

from components.tracking import PARENT_RUN_ENV, pipeline_run

IO_STAGES = frozenset({"generate_tasks", "collect", "annotate"})
ACCELERATOR_TAG = "accelerator"


def stage_order(root: Path) -> list[str]:
    """Stage names in dvc.yaml order (written topologically)."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    return list(spec["stages"])


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


@flow(name="pipeline", log_prints=True)
def pipeline(root: str = ".", stages: list[str] | None = None, force: bool = False) -> list[str]:
    """Run the given DVC stages (default: all) in order; returns the stages run."""
    root_path = Path(root).resolve()
    selected = stages or stage_order(root_path)
    unknown = sorted(set(selected) - set(stage_order(root_path)))
    if unknown:
        raise ValueError(f"unknown stages {unknown}; dvc.yaml has {stage_order(root_path)}")
    with pipeline_run(root_path, "pipeline", {"stages": selected, "force": force}) as run_id:
        for stage in selected:
            runner = repro_io_stage if stage in IO_STAGES else repro_compute_stage
            runner(stage, str(root_path), run_id, force)
    return selected


if __name__ == "__main__":
    pipeline()
