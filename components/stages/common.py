"""Helpers shared by the stage modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    """Write a metrics/report JSON file (sorted keys, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def numbers(stats: dict[str, Any]) -> dict[str, Any]:
    """Only the numeric entries (DVC metrics files hold numbers)."""
    return {
        k: v for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
