"""`make bench`: run every benchmark in turn; each writes its JSON under bench/results/."""

from __future__ import annotations

import importlib
import sys
import time

from bench.common import bench_parser

BENCHMARKS = (
    "bench.cli",
    "bench.collection",
    "bench.buffer",
    "bench.envs",
    "bench.miniwob_coverage",  # needs Chromium: elsewhere it leaves its results alone
    "bench.game_generation",
    "bench.answer_tree",
    "bench.synthetic_env",
    "bench.admissible_commands",
    "bench.verdicts",
    "bench.counterfactual_wins",
    "bench.policy_designs",
    "bench.cpu_kernels",
    "bench.generation",
    "bench.gpu_decode",  # CUDA only: elsewhere it leaves the committed GPU results alone
    "bench.decode_profile",  # CUDA only, likewise
    "bench.stages",
    "bench.stage_overhead",  # after bench.stages: quotes its stages' work beside the overhead
)


def main(names: list[str]) -> int:
    """Run the named benchmarks (default: all); returns a process exit code."""
    from components.cpu_kernels import pin_cpu_kernels

    pin_cpu_kernels()  # the kernels the stages run on (before any benchmark imports torch)
    failed = []
    for name in names or BENCHMARKS:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            importlib.import_module(name).main()
        # one broken benchmark must not hide the others' results (some end with SystemExit)
        except (Exception, SystemExit) as err:
            failed.append(name)
            print(f"{name} failed: {err!r}", file=sys.stderr)
        print(f"== {name}: {time.perf_counter() - start:.1f} s", flush=True)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = bench_parser("bench.run", __doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="MODULE",
        help=f"benchmark modules to run, in order (default: all of {', '.join(BENCHMARKS)})",
    )
    sys.exit(main(parser.parse_args().names))
