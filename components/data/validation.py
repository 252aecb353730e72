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


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _text_len(value: Any) -> int:
    return len(value) if isinstance(value, str) else -1


def add_derived_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Columns the consistency expectations need: position, last step, length checks."""
    df = df.copy()
    df["position"] = df.groupby(LINE_ID, sort=False).cumcount()
    last = df.groupby(LINE_ID, sort=False)["position"].transform("max")
    is_last = df["position"] == last
    done_true = df["done"].map(lambda v: v is True)
    reward_one = df["reward"].map(lambda v: v == 1 and not isinstance(v, bool))
    df["done_before_end"] = done_true & ~is_last
    # JSON true/false would pass the "int" type check (bool subclasses int) and be coerced
    df["bool_as_number"] = df["reward"].map(_is_bool) | df["step_index"].map(_is_bool)
    df["reward_without_done"] = reward_one & ~done_true
    for col in ("action", "state", "next_state", "instruction"):
        df[f"{col}_len"] = df[col].map(_text_len)
    # object columns: the type expectations then judge each value, not the column's dtype
    # (one float reward elsewhere in the batch would make a float64 column that fails
    # every row's "int" check, quarantining valid lines with it)
    for col in ("step_index", "reward", "done", "valid_action"):
        df[col] = df[col].astype(object)
    return df


def _expectations(cfg: IngestConfig) -> list[Any]:
    import great_expectations as gx

    e = gx.expectations
    out: list[Any] = [e.ExpectColumnValuesToNotBeNull(column=c) for c in REQUIRED]
    out += [e.ExpectColumnValuesToBeInTypeList(column=c, type_list=["str"]) for c in STRING_COLUMNS]
    out += [
        e.ExpectColumnValuesToBeInTypeList(column="action", type_list=["str"]),
        e.ExpectColumnValuesToBeInTypeList(column="step_index", type_list=["int"]),
        e.ExpectColumnValuesToBeInTypeList(column="reward", type_list=["int"]),
        e.ExpectColumnValuesToBeInTypeList(column="done", type_list=["bool"]),
        e.ExpectColumnValuesToBeInTypeList(column="valid_action", type_list=["bool"]),
        e.ExpectColumnValuesToBeInSet(column="reward", value_set=[0, 1]),
        e.ExpectColumnValuesToBeInSet(column="source", value_set=["real", "synthetic"]),
        e.ExpectColumnValuesToBeBetween(
            column="action_len", min_value=1, max_value=cfg.max_action_chars
        ),
        e.ExpectColumnValuesToBeBetween(
            column="state_len", min_value=1, max_value=cfg.max_state_chars
        ),
        e.ExpectColumnValuesToBeBetween(
            column="next_state_len", min_value=1, max_value=cfg.max_state_chars
        ),
        e.ExpectColumnValuesToBeBetween(
            column="instruction_len", min_value=1, max_value=cfg.max_state_chars
        ),
        e.ExpectColumnValuesToBeUnique(column="id"),
        e.ExpectColumnPairValuesToBeEqual(column_A="step_index", column_B="position"),
        e.ExpectColumnPairValuesToBeEqual(column_A="episode_id", column_B=LINE_EPISODE),
        e.ExpectColumnValuesToBeInSet(column="done_before_end", value_set=[False]),
        e.ExpectColumnValuesToBeInSet(column="reward_without_done", value_set=[False]),
        e.ExpectColumnValuesToBeInSet(column="bool_as_number", value_set=[False]),
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
