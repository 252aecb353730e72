"""Progress bars for long work: a live tqdm bar on a terminal, plain lines in logs.

Off a terminal (``make run > log``, CI, Prefect workers) tqdm's carriage-return redraws
pile up into one unreadable line of thousands of updates; there the bar redraws at most
every ``LOG_INTERVAL_S`` seconds, each redraw on a line of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, Any

LOG_INTERVAL_S = 30.0


class _Lines:
    """A stream for tqdm that writes each redraw as a whole line."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.last = ""

    def write(self, text: str) -> None:
        """Write ``text`` with carriage returns turned into line ends (no blank or repeated
        lines: tqdm redraws the final state when it closes)."""
        for line in text.replace("\r", "\n").split("\n"):
            if line.strip() and line != self.last:
                self.stream.write(line + "\n")
                self.last = line

    def flush(self) -> None:
        """Flush the underlying stream."""
        self.stream.flush()


def progress_bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A tqdm bar (same arguments); off a terminal, a plain line every ``LOG_INTERVAL_S``
    (``disable=None``, as in tqdm: no bar at all off a terminal)."""
    from tqdm.auto import tqdm

    stream = kwargs.get("file") or sys.stderr
    if not getattr(stream, "isatty", lambda: False)():
        if kwargs.get("disable", False) is None:
            kwargs["disable"] = True
        kwargs["mininterval"] = max(float(kwargs.get("mininterval", 0.1)), LOG_INTERVAL_S)
        kwargs["maxinterval"] = 2 * kwargs["mininterval"]
        kwargs["file"] = _Lines(stream)
        kwargs.setdefault("ncols", 100)
    return tqdm(iterable, **kwargs)
