"""The report's inputs: each metrics file and RL curve read once (data, or why there is none)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.artifacts import HISTORY_DIR  # metrics/history/<method>.jsonl: RL curves

NOT_RUN = "not run"
METRIC_FILES = (
    "data.json",
    "buffer.json",
    "annotate.json",
    "experience.json",
    "fidelity.json",
    "table1.json",
    "judge.json",
    "drift.json",
    "theorem1.json",
)


class _Inputs:
    """The metrics files, each read once: data, or why there is none."""

    def __init__(self, metrics_dir: Path) -> None:
        self.dir = metrics_dir
        self.data: dict[str, Any] = {}
        self.status: dict[str, str] = {}
        for name in METRIC_FILES:
            self._read(name, metrics_dir / name)
        # the experience stage may write one file per variant instead of experience.json
        if "experience.json" not in self.data and (metrics_dir / "experience").is_dir():
            per_variant = {}
            for p in sorted((metrics_dir / "experience").glob("*.json")):
                try:
                    per_variant[p.stem] = json.loads(p.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
            if per_variant:
                self.data["experience.json"] = per_variant
                self.status["experience.json"] = "ok (experience/<variant>.json)"
        self.history = self._read_history(metrics_dir / HISTORY_DIR)

    def _read_history(self, folder: Path) -> dict[str, list[dict[str, Any]]]:
        """``{method: rounds}`` from history/<method>.jsonl (unreadable lines skipped)."""
        curves: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else ():
            rows, bad = [], 0
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line) if line.strip() else None
                except ValueError:
                    row = None
                    bad += 1
                if isinstance(row, dict):
                    rows.append(row)
            name = f"{HISTORY_DIR}/{path.name}"
            self.status[name] = f"ok ({len(rows)} rounds)" + (f", {bad} bad lines" if bad else "")
            if rows:
                curves[path.stem] = rows
        if not curves:
            self.status[f"{HISTORY_DIR}/*.jsonl"] = NOT_RUN
        return curves

    def _read(self, name: str, path: Path) -> None:
        if not path.is_file():
            self.status[name] = NOT_RUN
            return
        try:
            self.data[name] = json.loads(path.read_text(encoding="utf-8"))
            self.status[name] = "ok"
        except (OSError, ValueError) as err:
            self.status[name] = f"unreadable ({type(err).__name__}: {err})"

    def get(self, name: str) -> Any:
        """The parsed file, or None."""
        return self.data.get(name)

    def missing(self, name: str) -> str:
        """The one-line markdown note of a file without data."""
        return f"_{name}: {self.status.get(name, NOT_RUN)}._\n"
