"""What every pipeline stage costs before and after its own work, beside the work itself.

``python -m bench.stage_overhead`` writes bench/results/stage_overhead.json. A stage is a
``dreamgym`` process that DVC starts and books: the interpreter, the CLI and config, MLflow
and its SQLite store (every stage opens a run) come before the stage's first line of work;
after it DVC rewrites dvc.lock (a comment-keeping YAML round trip of the whole file). Each
part is timed here on its own, in fresh processes (median of ``repeats``), on a scratch
MLflow store and a copy of the project's dvc.lock, so nothing of the project changes.

``fixed_seconds_per_stage`` adds them up (a floor: DVC's hashing of a stage's deps and
outputs comes on top) and ``fixed_seconds_per_pipeline`` multiplies it by the stage runs
in dvc.yaml (``foreach`` items counted). bench/results/stages.json (the stages' own work,
from the last ``make run``) is quoted beside it when present: it may come from another
host, so the share is a guide, not a measurement of one run.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import bench_parser, cpu_name

RESULTS = Path("bench/results")
REPEATS = 3

# what a stage process runs before its work, cumulatively (each is a fresh interpreter)
PREAMBLE = {
    "interpreter": "pass",
    "cli_and_config": "import components.cli, components.config",
    "plus_mlflow": "import components.cli, components.config, mlflow",
    "plus_store": (
        "import sys; from pathlib import Path; import components.cli, components.config; "
        "from components.tracking import configure, experiment_id; "
        "root = Path(sys.argv[1]); configure(root); experiment_id(root, 'bench')"
    ),
}
DVC_START = "import dvc.repo"


def _child_seconds(code: str, *args: str, repeats: int = REPEATS) -> list[float]:
    """Wall seconds of ``python -c code args`` in fresh processes."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def lock_round_trip_seconds(lock: Path, repeats: int = REPEATS) -> list[float]:
    """Seconds of the dvc.lock rewrite DVC makes after each stage, on a copy of ``lock``."""
    from dvc.utils.serialize import modify_yaml

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "dvc.lock"
        shutil.copyfile(lock, copy)
        for i in range(repeats):
            start = time.perf_counter()
            with modify_yaml(copy) as data:
                data.setdefault("bench", {})["round"] = i  # a change, as a stage's new hashes
            times.append(time.perf_counter() - start)
    return times


def stage_runs(dvc_yaml: Path) -> int:
    """Stage runs of one pipeline: each stage once, a ``foreach`` stage once per item."""
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {})
    return sum(len(s["foreach"]) if "foreach" in s else 1 for s in stages.values())


def _median(times: list[float]) -> float:
    return round(statistics.median(times), 3)


def main(repeats: int = REPEATS) -> dict[str, Any]:
    """Time each part of a stage's fixed cost; writes bench/results/stage_overhead.json."""
    root = Path(".").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        # the first open builds the store's schema: once per project, not per stage
        first_open = _child_seconds(PREAMBLE["plus_store"], str(store), repeats=1)[0]
        preamble = {
            name: _child_seconds(code, str(store), repeats=repeats)
            for name, code in PREAMBLE.items()
        }
    dvc_start = _child_seconds(DVC_START, repeats=repeats)
    lock = root / "dvc.lock"
    lock_times = lock_round_trip_seconds(lock, repeats) if lock.exists() else []
    parts = {
        "stage_preamble": _median(preamble["plus_store"]),
        "dvc_start": _median(dvc_start),
        "lock_round_trip": _median(lock_times) if lock_times else 0.0,
    }
    per_stage = round(sum(parts.values()), 3)
    n_runs = stage_runs(root / "dvc.yaml")
    result: dict[str, Any] = {
        "cpu": cpu_name(),
        "repeats": repeats,
        "preamble_seconds": {name: _median(t) for name, t in preamble.items()},
        "preamble_seconds_all": {name: [round(x, 3) for x in t] for name, t in preamble.items()},
        "first_store_open_seconds": round(first_open, 3),
        "dvc_start_seconds": parts["dvc_start"],
        "lock_round_trip_seconds": parts["lock_round_trip"],
        "lock_bytes": lock.stat().st_size if lock.exists() else 0,
        "fixed_seconds_per_stage": per_stage,
        "stage_runs": n_runs,
        "fixed_seconds_per_pipeline": round(per_stage * n_runs, 1),
        "note": "a floor: DVC's hashing of each stage's deps and outputs comes on top",
    }
    work = RESULTS / "stages.json"
    if work.exists():
        result["stages_work_seconds"] = json.loads(work.read_text()).get("total_seconds")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "stage_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_all")}, indent=2))
    return result


if __name__ == "__main__":
    bench_parser("bench.stage_overhead", __doc__).parse_args()
    main()
