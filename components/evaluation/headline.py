"""The run's one-screen headline: the only files DVC shows as metrics.

``metrics/headline/table1.json`` (stage table1): Table 1 success per method (the sampled
headline) and the training run time; ``metrics/headline/fidelity.json`` (stage
evaluate_fidelity): the experience model's fidelity beside its trivial baselines. Each is
written by the stage that computes its figures, so a partial ``dvc exp run`` (e.g. an
ablation up to ``evaluate_fidelity``) never shows a stale headline. Every other figure
stays in its own file under ``metrics/`` (``dvc metrics show metrics/<file>`` prints
one), so ``dvc metrics show`` and ``dvc exp show`` stay short. Only copies and rounds
numbers that the stages computed; a missing input leaves its keys out (never invented).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.artifacts import AGENT_DIR

HEADLINE_DIR = "headline"  # metrics/headline/{table1,fidelity}.json
TABLE1_HEADLINE = "table1.json"
FIDELITY_HEADLINE = "fidelity.json"
# headline key -> key of metrics/fidelity.json["full"] (the pipeline's experience model)
FIDELITY_KEYS = {
    "reward_acc": "reward_accuracy",
    "reward_acc_majority": "majority_baseline_reward_accuracy",
    "success_f1": "success_f1",
    "success_f1_always_win": "always_win_baseline_success_f1",
    "state_f1": "state_token_f1",
    "state_f1_nochange": "copy_baseline_state_token_f1",
    "commands_f1": "admissible_f1",
    "commands_f1_stay": "copy_baseline_admissible_f1",
    "eps_R": "eps_R",
}


def _read(path: Path) -> dict[str, Any]:
    """A JSON object, or {} when the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(value: Any) -> float | None:
    """``value`` if it is a real number (bools and strings are not)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def success_headline(table: Mapping[str, Any], env: str | None = None) -> dict[str, float]:
    """Sampled success per method of one env of Table 1 (its first env when None)."""
    envs = [k for k in table if not k.startswith("_") and isinstance(table[k], Mapping)]
    name = env if env in envs else (envs[0] if envs else None)
    rows = table.get(name, {}) if name else {}
    out = {}
    for method, row in rows.items():
        value = _number(row.get("success")) if isinstance(row, Mapping) else None
        if value is not None:
            out[method] = round(value, 4)
    return out


def train_minutes(agent_dir: Path) -> float | None:
    """Wall minutes of the training stages together (metrics/agent/*.json).

    GRPO and PPO train in one stage and both files carry its wall time: a stage named
    in its files (``stage``) counts once.
    """
    by_stage: dict[str, float] = {}
    for path in sorted(agent_dir.glob("*.json")):
        data = _read(path)
        seconds = _number(data.get("wall_seconds"))
        if seconds is not None:
            stage = data.get("stage")
            by_stage[stage if isinstance(stage, str) else path.stem] = seconds
    return round(sum(by_stage.values()) / 60.0, 1) if by_stage else None


def table1_headline(
    table: Mapping[str, Any], agent_dir: Path, env: str | None = None
) -> dict[str, Any]:
    """``{"success": {method: rate}, "train_minutes": m}`` (keys with no data left out)."""
    headline: dict[str, Any] = {}
    success = success_headline(table, env)
    if success:
        headline["success"] = success
    minutes = train_minutes(agent_dir)
    if minutes is not None:
        headline["train_minutes"] = minutes
    return headline


def fidelity_headline(full: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"fidelity": {...}}``: the full model's reward / state figures beside baselines."""
    fidelity = {}
    for key, source in FIDELITY_KEYS.items():
        value = _number(full.get(source)) if isinstance(full, Mapping) else None
        if value is not None:
            fidelity[key] = round(value, 4)
    return {"fidelity": fidelity} if fidelity else {}


def build_headline(metrics_dir: Path, env: str | None = None) -> dict[str, Any]:
    """Both headline parts from the metrics files (what ``make summary``-like tools read)."""
    table = table1_headline(_read(metrics_dir / "table1.json"), metrics_dir / AGENT_DIR, env)
    return {**fidelity_headline(_read(metrics_dir / "fidelity.json").get("full")), **table}
