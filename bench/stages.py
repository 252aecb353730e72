"""Wall time per pipeline stage on the cpu profile, read from the stage runs in MLflow.

``python -m bench.stages`` writes bench/results/stages.json. Every stage opens an MLflow
run (``components.tracking.stage_run``) tagged ``stage`` and ``profile`` (and ``variant``
for the experience-model variants); its duration is end - start of that run, i.e. the
stage's work without the interpreter start and imports (a few seconds; see
bench/results/cli.json for the CLI's start-up). Nothing is re-run: the figures are those
of the last ``dvc repro`` / ``make run`` on this machine.

A stage that found its outputs done (a resumed collection, cached games) finishes in a
fraction of a second. ``seconds`` is therefore the most recent *full* run: the latest run
that took at least half as long as the stage's longest run; ``latest_seconds`` is the
latest run whatever it did. Stages in dvc.yaml without a finished cpu run are listed
under ``missing``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from bench.common import bench_parser

RESULTS = Path("bench/results")
PROFILE = "cpu"
FULL_RUN_SHARE = 0.5  # a run this fraction of the longest one counts as a full run


def stage_runs(root: Path, profile: str = PROFILE) -> list[dict[str, Any]]:
    """Finished stage runs of ``profile``: stage key, start (ms) and seconds, oldest first."""
    import mlflow

    from components.tracking import configure

    configure(root)
    runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.profile = '{profile}' and attributes.status = 'FINISHED'",
        output_format="list",
    )
    out = []
    for run in runs:
        tags = run.data.tags
        if "stage" not in tags or run.info.end_time is None:
            continue
        key = dvc_name(tags["stage"], tags.get("variant"))
        seconds = (run.info.end_time - run.info.start_time) / 1000
        out.append({"stage": key, "start_ms": run.info.start_time, "seconds": seconds})
    return sorted(out, key=lambda r: r["start_ms"])


# MLflow stage names of runs logged before they were the dvc.yaml names
_LEGACY = {
    "train_sft_baseline": "train_sft",
    "train_dpo_baseline": "train_dpo",
    "build_table1": "table1",
}


def dvc_name(stage: str, variant: str | None = None) -> str:
    """The dvc.yaml stage name (``foreach`` item after ``@``) of an MLflow stage run."""
    stage = _LEGACY.get(stage, stage)
    if stage == "train_experience_model":  # the full variant was logged without its item
        return f"{stage}@{variant or 'full'}"
    if stage in ("evaluate_random", "evaluate_policy@random"):  # its own dvc.yaml stage
        return "evaluate_random"
    if stage.startswith("evaluate_") and stage != "evaluate_fidelity" and "@" not in stage:
        return "evaluate_policy@" + stage.removeprefix("evaluate_")
    return stage


def summarize(runs: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    """Per stage: the latest full run's seconds, the latest run's, the longest, the count."""
    stages: dict[str, Any] = {}
    for key in {r["stage"] for r in runs}:
        mine = [r for r in runs if r["stage"] == key]
        longest = max(r["seconds"] for r in mine)
        full = [r for r in mine if r["seconds"] >= FULL_RUN_SHARE * longest]
        stages[key] = {
            "seconds": round(full[-1]["seconds"], 2),
            "latest_seconds": round(mine[-1]["seconds"], 2),
            "max_seconds": round(longest, 2),
            "runs": len(mine),
        }

    def rank(key: str) -> tuple[int, str]:
        base = key.split("@")[0]
        return (order.index(base) if base in order else len(order), key)

    ordered = {k: stages[k] for k in sorted(stages, key=rank)}
    seen = {k.split("@")[0] for k in stages}
    return {
        "seconds": {k: v["seconds"] for k, v in ordered.items()},
        "total_seconds": round(sum(v["seconds"] for v in ordered.values()), 1),
        "stages": ordered,
        "missing": [s for s in order if s not in seen],
    }


def dvc_stage_order(root: Path) -> list[str]:
    """Stage names in dvc.yaml order (the pipeline order)."""
    path = root / "dvc.yaml"
    if not path.exists():
        return []
    return list((yaml.safe_load(path.read_text()) or {}).get("stages", {}))


def main() -> dict[str, Any]:
    """Read the stage durations; writes bench/results/stages.json."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    root = Path(".").resolve()
    order = dvc_stage_order(root)
    runs = stage_runs(root) if (root / "mlflow.db").exists() else []
    out = RESULTS / "stages.json"
    if not runs:  # a fresh clone: keep the committed figures instead of an empty file
        print(f"no finished {PROFILE} stage runs in mlflow.db: {out} left as it is")
        return json.loads(out.read_text()) if out.exists() else {}
    result = {
        "profile": PROFILE,
        "source": "MLflow stage runs in mlflow.db (end - start of each stage's run)",
        **summarize(runs, order),
        "rule": f"seconds = latest run >= {FULL_RUN_SHARE} x the stage's longest run "
        "(resumed/no-op runs are skipped); excludes interpreter start-up and imports",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["seconds"], indent=2))
    return result


if __name__ == "__main__":
    bench_parser("bench.stages", __doc__).parse_args()
    main()
