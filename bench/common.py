"""What the benchmark scripts share."""

from __future__ import annotations

import argparse
import inspect
import platform
import textwrap
from collections.abc import Mapping
from pathlib import Path

WIDTH = 79  # of --help's description and epilog (argparse wraps its own parts likewise)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_name() -> str:
    """The CPU's model name, else what ``platform`` knows of it."""
    return cpu_model() or platform.processor() or platform.machine()


def bench_parser(
    module: str, doc: str | None, env: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """The command line of ``python -m <module>``: ``--help`` and nothing else by default.

    The description is the first paragraph of the module's docstring ``doc``; ``env`` maps
    each environment variable the benchmark reads to what it sets (listed in the epilog).
    Add the module's own arguments, then ``parse_args()``: ``--help`` exits 0 and an
    unknown argument exits 2, both before any benchmark work. A module that bench.run
    drives parses in its ``__main__`` block, not in ``main()``: bench.run calls each
    ``main()`` with no arguments, under its own argv.
    """
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    description = textwrap.fill(" ".join(paragraphs[0].split()), width=WIDTH)
    epilog = []
    if env:
        epilog.append("environment variables:")
        pad = max(map(len, env)) + 4
        for name, what in env.items():
            epilog.append(
                textwrap.fill(
                    " ".join(what.split()),
                    width=WIDTH,
                    initial_indent=f"  {name}".ljust(pad),
                    subsequent_indent=" " * pad,
                )
            )
        epilog.append("")
    epilog.append(f"details: the docstring of {module.replace('.', '/')}.py")
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=description,
        epilog="\n".join(epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
