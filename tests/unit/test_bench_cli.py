"""Every runnable bench module parses its argv: ``--help`` does no work, unknown args exit 2.

Each module runs as ``python -m bench.<name>`` in a fresh process whose working directory
is an empty temporary folder, so a module that ignored its argv and started measuring
would write there (and fail the test) rather than over bench/results/.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# what --help must not load: the benchmarks import these only to measure
HEAVY = {
    "datasets",
    "lancedb",
    "mlflow",
    "numpy",
    "pandas",
    "prefect",
    "pyarrow",
    "scipy",
    "sklearn",
    "textworld",
    "torch",
    "transformers",
    "triton",
    "trl",
}


def _runnable() -> list[str]:
    """bench modules with a ``__main__`` block, found in their source."""
    names = []
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
        ):
            names.append(path.stem)
    return names


MODULES = _runnable()


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", f"bench.{module}", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _imported(stderr: str) -> set[str]:
    """Top-level packages that ``-X importtime`` reports as imported."""
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def _first_paragraph(module: str) -> str:
    doc = ast.get_docstring(ast.parse((BENCH / f"{module}.py").read_text(encoding="utf-8")))
    assert doc, f"bench/{module}.py has no docstring"
    return " ".join(doc.split("\n\n")[0].split())


def test_the_runnable_modules_are_found():
    assert {"run", "verdicts", "policy_designs", "gpu_decode", "selection"} <= set(MODULES)
    assert "common" not in MODULES and "fused_decode" not in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_help_describes_the_module_and_does_nothing(module: str, tmp_path: Path):
    proc = _run(module, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python -m bench.{module}")
    assert _first_paragraph(module) in " ".join(proc.stdout.split())
    # every environment variable the module reads is in the epilog
    source = (BENCH / f"{module}.py").read_text(encoding="utf-8")
    for name in re.findall(r"environ\.get\(\s*\"([A-Z0-9_]+)\"", source):
        assert name in proc.stdout, f"{name} missing from bench.{module} --help"
    assert not HEAVY & _imported(proc.stderr), sorted(HEAVY & _imported(proc.stderr))
    assert not list(tmp_path.iterdir()), "--help wrote files"


@pytest.mark.parametrize("module", MODULES)
def test_an_unknown_option_is_an_error(module: str, tmp_path: Path):
    proc = _run(module, "--no-such-option", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "usage: python -m bench." in proc.stderr
    assert not HEAVY & _imported(proc.stderr)
    assert not list(tmp_path.iterdir())


def test_bench_run_calls_every_benchmark_without_arguments():
    """`make bench` imports each module and calls ``main()``: argv is parsed only in __main__."""
    import importlib

    from bench.run import BENCHMARKS

    for name in BENCHMARKS:
        main = importlib.import_module(name).main
        inspect.signature(main).bind()  # no required parameters
        source = inspect.getsource(main)
        assert "sys.argv" not in source and "parse_args" not in source, name
