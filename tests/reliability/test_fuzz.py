"""Property-based fuzz (hypothesis) of trajectory lines and of params files/overrides.

Trajectory lines: arbitrary bytes, arbitrary JSON, deep nesting, and valid trajectories
with one field replaced by an arbitrary JSON value, a key dropped or added, or the whole
line repeated. Properties: parsing never raises; a whole ingestion never raises, every
line is ingested or quarantined exactly once with its original bytes, and every valid
line is ingested (a later duplicate is quarantined, never its original).

Params: one leaf of the real params.yaml (defaults or the ci overlay) replaced by an
arbitrary YAML value, and the file's text mutated byte-wise. Property: ``dreamgym config``
exits 0 or 2, and on 2 prints exactly one ``error:`` line and no traceback.

Seeds are derandomized (the same cases in CI every time); each test prints its counts.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from components.cli import EXIT_CONFIG, app
from components.config import IngestConfig
from components.data.ingest import (
    QUARANTINE_FILE,
    TRAJECTORIES_FILE,
    TRANSITIONS_FILE,
    RawLine,
    _parse,
    ingest,
)
from components.schema import Trajectory, read_jsonl
from tests.factories import make_trajectory
from tests.reliability.project import ROOT

pytestmark = pytest.mark.timeout(300)
CFG = IngestConfig(max_line_bytes=20_000, max_state_chars=2_000, max_action_chars=120)
_BASE_SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(examples: int) -> settings:
    """Derandomized settings with ``examples`` cases (the test's time budget)."""
    return settings(_BASE_SETTINGS, max_examples=examples)


# -- values -------------------------------------------------------------------------------

_ints = st.one_of(
    st.integers(-3, 5),
    st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.integers(),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "true", "false", "3", "0", "null", "yes", "real", "train", "expert"]),
    st.text(max_size=30),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _obj(idx: int, n_steps: int) -> dict[str, Any]:
    return json.loads(make_trajectory(n_steps=n_steps, idx=idx).model_dump_json())


@st.composite
def mutated_line(draw, idx: int) -> bytes:
    """A valid trajectory (own ids) with one key replaced, dropped or added."""
    obj = _obj(idx, draw(st.integers(1, 3)))
    where = draw(st.sampled_from(["top", "step", "provenance"]))
    target = {"top": obj, "step": obj["steps"][0], "provenance": obj["steps"][0]["provenance"]}
    target = target[where]
    key = draw(st.sampled_from(sorted(target)) | st.text(min_size=1, max_size=6))
    op = draw(st.sampled_from(["set", "drop"]))
    if op == "drop" and key in target:
        del target[key]
    else:
        target[key] = draw(json_values)
    return json.dumps(obj, ensure_ascii=draw(st.booleans())).encode()


def _deep(levels: int, opener: str) -> bytes:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "{":
        return ('{"a":' * levels + "1" + "}" * levels).encode()
    return (opener * levels + closer * levels).encode()


deep_lines = st.builds(_deep, st.integers(1, 2000), st.sampled_from(["[", "{"]))
arbitrary_lines = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    deep_lines,
    mutated_line(999_999),
)


def _one_line(data: bytes) -> bytes:
    return data.replace(b"\n", b" ")  # a newline would make two lines


# -- trajectory lines ---------------------------------------------------------------------


def test_fuzz_parse_never_raises() -> None:
    """Every line, however broken, parses to an object or to a quarantine reason."""
    seen = {"lines": 0}

    @fuzz(300)
    @given(arbitrary_lines)
    def check(data: bytes) -> None:
        seen["lines"] += 1
        obj, reason = _parse(RawLine("f.jsonl", 1, _one_line(data)), CFG)
        assert (obj is None) != (reason is None)
        assert reason is None or (isinstance(reason, str) and reason)

    check()
    print(f"\n[fuzz] parse: {seen['lines']} lines, 0 exceptions")


@st.composite
def batches(draw) -> list[tuple[str, bytes]]:
    """(kind, line) in order: valid lines, their later duplicates, and broken lines."""
    out: list[tuple[str, bytes]] = []
    valid: list[bytes] = []
    # long batches, few of them: the cost of an ingestion is its validation suite's, ~1 s
    # however few its lines, so 20 batches of up to 24 lines fuzz as many lines as 40 of 12
    for i in range(draw(st.integers(4, 24))):
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "raw", "duplicate"]))
        idx = 1000 * draw(st.integers(0, 10**6)) + i  # own episode and transition ids
        if kind == "valid":
            line = json.dumps(_obj(idx, draw(st.integers(1, 4)))).encode()
            valid.append(line)
        elif kind == "duplicate" and valid:
            line = draw(st.sampled_from(valid))
        elif kind == "mutated":
            line = draw(mutated_line(idx))
        else:
            kind, line = "raw", draw(arbitrary_lines)
        out.append((kind, _one_line(line)))
    return out


@pytest.mark.slow
def test_fuzz_ingest_batches_lose_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Whole ingestions: no exception, every line in one place, every valid line ingested."""
    counts = {"batches": 0, "lines": 0, "ingested": 0, "quarantined": 0}

    @fuzz(20)
    @given(batches())
    def check(batch: list[tuple[str, bytes]]) -> None:
        tmp = tmp_path_factory.mktemp("fuzz")
        raw = tmp / "raw.jsonl"
        raw.write_bytes(b"\n".join(line for _, line in batch) + b"\n")
        report = ingest([raw], tmp / "ingested", tmp / "quarantine", CFG)  # never raises
        assert report.n_lines == len(batch)
        assert report.n_ingested + report.n_quarantined == len(batch)

        kept = list(read_jsonl(tmp / "ingested" / TRAJECTORIES_FILE, Trajectory))
        text = (tmp / "quarantine" / QUARANTINE_FILE).read_text(encoding="utf-8")
        quarantined = {q["line_no"]: q for q in map(json.loads, text.splitlines())}
        assert len(quarantined) == report.n_quarantined and len(kept) == report.n_ingested
        for no, q in quarantined.items():
            back = q["raw"].encode() if "raw" in q else base64.b64decode(q["raw_base64"])
            assert back == batch[no - 1][1].rstrip(b"\r\n") and q["reasons"]
        # nothing lost: the lines not quarantined are exactly the ingested trajectories
        passed = [batch[no - 1][1] for no in range(1, len(batch) + 1) if no not in quarantined]
        assert [json.loads(x)["episode_id"] for x in passed] == [t.episode_id for t in kept]
        # every valid line is kept: only its later duplicates are quarantined
        for no, (kind, _) in enumerate(batch, start=1):
            assert kind != "valid" or no not in quarantined, quarantined.get(no)
        frame = pd.read_parquet(tmp / "ingested" / TRANSITIONS_FILE)
        assert len(frame) == sum(t.n_steps for t in kept)
        counts["batches"] += 1
        counts["lines"] += len(batch)
        counts["ingested"] += report.n_ingested
        counts["quarantined"] += report.n_quarantined

    check()
    print(f"\n[fuzz] ingest: {counts}, lost=0")


# -- params -------------------------------------------------------------------------------


def _leaves(data: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, (*prefix, k))]
    return [prefix]


BASE = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
BASE["profile"] = "ci"
LEAVES = _leaves(BASE)
yaml_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _config_cli(path: Path) -> str | None:
    """Run ``dreamgym config``: None when valid, else its one error line (asserted)."""
    result = CliRunner().invoke(app, ["config", "--params", str(path)])
    assert result.exit_code in (0, EXIT_CONFIG), (result.exit_code, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code == 0:
        return None
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_fuzz_params_overrides_are_valid_or_one_line(tmp_path: Path) -> None:
    counts = {"overrides": 0, "rejected": 0}
    path = tmp_path / "params.yaml"

    @fuzz(80)
    @given(st.sampled_from(LEAVES), yaml_values, st.booleans())
    def check(leaf: tuple, value: Any, in_profile: bool) -> None:
        params = json.loads(json.dumps(BASE))
        if in_profile and leaf[0] not in ("profile", "profiles"):
            leaf = ("profiles", "ci", *leaf)  # the same key, overridden by the ci overlay
        target = params
        for key in leaf[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[leaf[-1]] = value
        path.write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
        line = _config_cli(path)
        counts["overrides"] += 1
        counts["rejected"] += line is not None

    check()
    print(f"\n[fuzz] params overrides: {counts}")


@st.composite
def mutated_params(draw) -> bytes:
    """The real params.yaml with a few byte-level edits (deletions, insertions, repeats)."""
    data = bytearray((ROOT / "params.yaml").read_bytes())
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["delete", "insert", "repeat_line", "byte"]))
        if op == "delete":
            del data[pos : pos + draw(st.integers(1, 40))]
        elif op == "insert":
            data[pos:pos] = draw(
                st.sampled_from([b":", b"- ", b"  ", b"\t", b"{", b"[", b"'", b"&a", b"*a", b"?"])
                | st.binary(min_size=1, max_size=8)
            )
        elif op == "repeat_line":
            start = data.rfind(b"\n", 0, pos) + 1
            end = data.find(b"\n", pos)
            end = len(data) if end < 0 else end + 1
            data[end:end] = data[start:end]
        elif pos < len(data):
            data[pos] = draw(st.integers(0, 255))
    return bytes(data)


def test_fuzz_params_text_is_valid_or_one_line(tmp_path: Path) -> None:
    counts = {"files": 0, "rejected": 0}
    path = tmp_path / "params.yaml"

    @fuzz(100)
    @given(mutated_params())
    def check(data: bytes) -> None:
        path.write_bytes(data)
        line = _config_cli(path)
        counts["files"] += 1
        counts["rejected"] += line is not None

    check()
    print(f"\n[fuzz] params text: {counts}")
