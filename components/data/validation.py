"""Great Expectations suite over flattened transitions, with per-row failure reasons.

The suite checks required fields, types (no JSON booleans for numbers), reward in {0, 1},
non-empty bounded texts, done consistency (done only on the last step, reward 1 only when
done), step order and duplicate ids. It runs on a pandas frame with a ``row_id`` column so
every failing row can be traced back to the JSONL line it came from.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pandas as pd

from components.config import IngestConfig

ROW_ID = "row_id"  # one per transition
LINE_ID = "line_id"  # the JSONL line (trajectory) the transition came from
LINE_EPISODE = "line_episode_id"  # the episode id declared by that line
REQUIRED = (
    "id",
    "task_id",
    "env",
    "episode_id",
    "step_index",
    "instruction",
    "state",
    "action",
    "next_state",
    "reward",
    "done",
    "valid_action",
    "source",
)
STRING_COLUMNS = ("id", "task_id", "env", "episode_id", "instruction", "state", "next_state")


@dataclass(frozen=True)
class ValidationOutcome:
    """Result of one suite run: success, per-row reasons and a JSON-able summary."""

    success: bool
    failures: dict[int, list[str]]  # row_id -> reasons
    summary: dict[str, Any]


def _is_int(value: Any) -> bool:
    # JSON true/false are not numbers here (bool subclasses int in Python)
    return isinstance(value, int) and not isinstance(value, bool)


def _text_len(value: Any) -> int:
    return len(value) if isinstance(value, str) else -1


# Per-value checks, computed in Python and handed to GX as boolean columns: GX's own type
# and set expectations judge a mixed-type object column as a whole (one float or dict
# elsewhere in the batch made them fail, or raise on, every row: valid lines quarantined).
VALUE_CHECKS: dict[str, tuple[str, Any]] = {
    **{f"{c}_is_text": (c, lambda v: isinstance(v, str)) for c in (*STRING_COLUMNS, "action")},
    "step_index_is_int": ("step_index", _is_int),
    "reward_is_int": ("reward", _is_int),
    "reward_in_0_1": ("reward", lambda v: _is_int(v) and v in (0, 1)),
    "done_is_bool": ("done", lambda v: isinstance(v, bool)),
    "valid_action_is_bool": ("valid_action", lambda v: isinstance(v, bool)),
    "source_known": ("source", lambda v: isinstance(v, str) and v in ("real", "synthetic")),
}


def add_derived_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Columns the expectations need: per-value checks, position, last step, text lengths."""
    df = df.copy()
    for name, (col, check) in VALUE_CHECKS.items():
        df[name] = df[col].map(check).astype(bool)
    df["position"] = df.groupby(LINE_ID, sort=False).cumcount()
    last = df.groupby(LINE_ID, sort=False)["position"].transform("max")
    is_last = df["position"] == last
    done_true = df["done"].map(lambda v: v is True)
    reward_one = df["reward"].map(lambda v: _is_int(v) and v == 1)
    df["done_before_end"] = done_true & ~is_last
    df["reward_without_done"] = reward_one & ~done_true
    df["step_in_order"] = [
        _is_int(s) and s == p for s, p in zip(df["step_index"], df["position"], strict=True)
    ]
    df["episode_matches_line"] = [
        isinstance(e, str) and e == line
        for e, line in zip(df["episode_id"], df[LINE_EPISODE], strict=True)
    ]
    # uniqueness over text ids only (a dict id is unhashable and already fails id_is_text)
    df["id_key"] = df["id"].map(lambda v: v if isinstance(v, str) else None)
    for col in ("action", "state", "next_state", "instruction"):
        df[f"{col}_len"] = df[col].map(_text_len)
    return df


def _expectations(cfg: IngestConfig) -> list[Any]:
    import great_expectations as gx

    e = gx.expectations
    out: list[Any] = [e.ExpectColumnValuesToNotBeNull(column=c) for c in REQUIRED]
    checks = [*VALUE_CHECKS, "step_in_order", "episode_matches_line"]
    out += [e.ExpectColumnValuesToBeInSet(column=c, value_set=[True]) for c in checks]
    out += [
        e.ExpectColumnValuesToBeBetween(
            column="action_len", min_value=1, max_value=cfg.max_action_chars
        ),
        e.ExpectColumnValuesToBeBetween(
            column="state_len", min_value=1, max_value=cfg.max_state_chars
        ),
        e.ExpectColumnValuesToBeBetween(
            column="next_state_len", min_value=1, max_value=cfg.max_state_chars
        ),
        e.ExpectColumnValuesToBeBetween(  # empty: a user's game without a goal
            column="instruction_len", min_value=0, max_value=cfg.max_state_chars
        ),
        e.ExpectColumnValuesToBeUnique(column="id_key"),
        e.ExpectColumnValuesToBeInSet(column="done_before_end", value_set=[False]),
        e.ExpectColumnValuesToBeInSet(column="reward_without_done", value_set=[False]),
    ]
    return out


def _describe(config: Any) -> str:
    kw = config.kwargs
    cols = kw.get("column") or f"{kw.get('column_A')}={kw.get('column_B')}"
    return f"{config.type}({cols})"


def validate_transitions(df: pd.DataFrame, cfg: IngestConfig) -> ValidationOutcome:
    """Run the suite on ``df`` (needs the row, line and line-episode columns)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    df = add_derived_columns(df)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        ctx.data_sources.add_pandas(name="ingest")
        .add_dataframe_asset(name="transitions")
        .add_batch_definition_whole_dataframe("all")
    )
    # all at once: add_expectation() one by one saves the suite every time (~1 s per batch)
    suite = ctx.suites.add(gx.ExpectationSuite(name="transitions", expectations=_expectations(cfg)))
    definition = ctx.validation_definitions.add(
        gx.ValidationDefinition(name="transitions", data=batch, suite=suite)
    )
    result = definition.run(
        batch_parameters={"dataframe": df},
        result_format={
            "result_format": "COMPLETE",
            "unexpected_index_column_names": [ROW_ID],
            "return_unexpected_index_query": False,
            # only the row ids are needed; GX's counting of the unexpected values crashes
            # (and so fails every row) when the first one is a dict and a later one is not
            "exclude_unexpected_values": True,
        },
    )
    failures: dict[int, list[str]] = defaultdict(list)
    per_expectation = []
    for r in result.results:
        name = _describe(r.expectation_config)
        raised = bool(r.exception_info and r.exception_info.get("raised_exception"))
        if raised:
            # An expectation that cannot even evaluate fails every row, loudly.
            for rid in df[ROW_ID]:
                failures[int(rid)].append(f"{name}: could not be evaluated")
        for item in r.result.get("unexpected_index_list") or []:
            # one dict per row, or (values excluded) one dict holding the list of row ids
            rids = item[ROW_ID] if isinstance(item[ROW_ID], list) else [item[ROW_ID]]
            for rid in rids:
                failures[int(rid)].append(name)
        per_expectation.append(
            {
                "expectation": name,
                "success": bool(r.success),
                "unexpected_count": int(r.result.get("unexpected_count") or 0),
                "raised": raised,
            }
        )
    stats = result.statistics
    summary = {
        "success": bool(result.success),
        "evaluated_expectations": int(stats["evaluated_expectations"]),
        "successful_expectations": int(stats["successful_expectations"]),
        "unsuccessful_expectations": int(stats["unsuccessful_expectations"]),
        "n_rows": len(df),
        "n_failed_rows": len(failures),
        "expectations": per_expectation,
    }
    return ValidationOutcome(bool(result.success), dict(failures), summary)
