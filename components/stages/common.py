"""Helpers shared by the stage modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.io import atomic_write_text


def write_json(path: Path, data: Any) -> None:
    """Write a metrics/report JSON file atomically (sorted keys, trailing newline)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def numbers(stats: dict[str, Any]) -> dict[str, Any]:
    """Only the numeric entries (DVC metrics files hold numbers)."""
    return {
        k: v for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
