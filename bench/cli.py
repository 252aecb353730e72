"""Start-up time of `dreamgym --help` (it must not import torch or trainers)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import bench_parser

RESULTS = Path("bench/results")


def main(repeats: int = 5) -> dict:
    """Time `dreamgym --help` in fresh processes; writes bench/results/cli.json."""
    exe = shutil.which("dreamgym") or str(Path(sys.executable).parent / "dreamgym")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([exe, "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    result = {
        "help_seconds": round(statistics.median(times), 3),
        "help_seconds_all": [round(t, 3) for t in times],
        "repeats": repeats,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cli.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    bench_parser("bench.cli", __doc__).parse_args()
    main()
