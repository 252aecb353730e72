"""Helpers shared by the stage modules."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.io import atomic_write_text


def json_text(data: Any) -> str:
    """A metrics/report JSON file's text (sorted keys, trailing newline)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Write a metrics/report JSON file atomically (sorted keys, trailing newline)."""
    atomic_write_text(path, json_text(data))


def numbers(stats: dict[str, Any]) -> dict[str, Any]:
    """Only the numeric entries (DVC metrics files hold numbers)."""
    return {
        k: v for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def alias_tags(
    prefix: str, stats: Mapping[str, Any], rounded: Sequence[str], count: str, run_id: str
) -> dict[str, Any]:
    """Model-registry alias tags ``<prefix>.<key>``: the ``rounded`` stats (4 places), the
    ``count`` stat, then the MLflow run id."""
    tags = {f"{prefix}.{k}": round(stats[k], 4) for k in rounded}
    return tags | {f"{prefix}.{count}": stats[count], f"{prefix}.run_id": run_id}
