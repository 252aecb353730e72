"""Case 1, bad input: every line of a malformed corpus is ingested or quarantined, exactly once.

The corpus (tests/reliability/corpus.py) mixes valid rows, prompt-injection rows (valid
data, ingested byte for byte) and ~90 kinds of malformed rows, plus seeded byte-level
fuzz, over three files (one CRLF, one without a final newline). The real ingestion runs
once over all of it: it must not abort, and rows tried = ingested + quarantined with
lost = 0 and duplicated = 0. The injection rows then go through the buffer (SQL filters),
the teacher and the experience-model prompt, where they must stay inert text.
"""

from __future__ import annotations

import base64
import json
import os
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from components.data.ingest import (
    QUARANTINE_FILE,
    REPORT_FILE,
    TRAJECTORIES_FILE,
    TRANSITIONS_FILE,
    ingest,
)
from components.experience.format import (
    MalformedOutputError,
    StepContext,
    parse_answer,
    render_prompt,
)
from components.schema import Trajectory, read_jsonl
from tests.reliability.corpus import (
    CANARY,
    CFG,
    INGEST,
    INJECTION_EPISODE_ID,
    INJECTIONS,
    QUARANTINE,
    PlacedLine,
    build_corpus,
    write_corpus,
)

pytestmark = pytest.mark.timeout(180)
N_FUZZ = 150


def _ingest_corpus(tmp: Path) -> tuple[list[PlacedLine], object, list[Trajectory], list[dict]]:
    placed = write_corpus(build_corpus(n_valid=12, n_fuzz=N_FUZZ, seed=0), tmp / "raw")
    files = sorted((tmp / "raw").glob("*.jsonl"))
    report = ingest(files, tmp / "ingested", tmp / "quarantine", CFG)  # must not raise
    kept = list(read_jsonl(tmp / "ingested" / TRAJECTORIES_FILE, Trajectory))
    text = (tmp / "quarantine" / QUARANTINE_FILE).read_text(encoding="utf-8")
    quarantined = [json.loads(line) for line in text.splitlines()]
    return placed, report, kept, quarantined


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory):
    """One ingestion of the whole corpus (shared by the tests of this module)."""
    tmp = tmp_path_factory.mktemp("corpus")
    cwd = Path.cwd()
    os.chdir(tmp)  # a shell-injection canary would land here
    try:
        return tmp, *_ingest_corpus(tmp)
    finally:
        os.chdir(cwd)


def test_counts_add_up_nothing_lost_nothing_duplicated(ingested) -> None:
    tmp, placed, report, kept, quarantined = ingested
    tried = len(placed)
    assert report.n_lines == tried
    assert report.n_ingested + report.n_quarantined == tried
    assert (len(kept), len(quarantined)) == (report.n_ingested, report.n_quarantined)

    q_keys = [(q["file"], q["line_no"]) for q in quarantined]
    assert len(set(q_keys)) == len(q_keys), "a line was quarantined twice"
    kept_ids = [t.episode_id for t in kept]
    assert len(set(kept_ids)) == len(kept_ids), "an episode was ingested twice"
    assert set(q_keys) <= {(p.file, p.line_no) for p in placed}

    # lost = 0: every line that is not quarantined is exactly one ingested trajectory
    passed = [p for p in placed if (p.file, p.line_no) not in set(q_keys)]
    assert len(passed) == len(kept)
    by_id = {t.episode_id: t for t in kept}
    for p in passed:
        obj = json.loads(p.line.data)
        assert by_id[obj["episode_id"]] == Trajectory.model_validate(obj), p.line.case
    assert all(q["reasons"] and all(q["reasons"]) for q in quarantined)

    saved = json.loads((tmp / "quarantine" / REPORT_FILE).read_text())
    assert saved["n_lines"] == tried and saved["n_quarantined"] == len(quarantined)
    # each failure kind is counted once per line that has it
    kinds = Counter()
    for q in quarantined:
        kinds.update({_kind(r) for r in q["reasons"]})
    assert saved["reasons"] == dict(kinds)
    frame = pd.read_parquet(tmp / "ingested" / TRANSITIONS_FILE)
    assert len(frame) == report.n_transitions == sum(t.n_steps for t in kept)
    assert frame["id"].is_unique
    print(
        f"\n[bad input] rows tried={tried} ingested={len(kept)} quarantined={len(quarantined)} "
        f"lost=0 duplicated=0 (labelled={tried - N_FUZZ}, fuzzed={N_FUZZ})"
    )


def _kind(reason: str) -> str:
    text = reason.split(": ", 1)[1] if reason.startswith("step ") else reason
    return text.split(":", 1)[0].split(" (", 1)[0].strip()


def test_each_labelled_line_meets_its_fate_with_its_reason(ingested) -> None:
    _, placed, _, kept, quarantined = ingested
    q_by_key = {(q["file"], q["line_no"]): q for q in quarantined}
    kept_ids = {t.episode_id for t in kept}
    wrong = []
    for p in placed:
        q = q_by_key.get((p.file, p.line_no))
        if p.line.fate == INGEST:
            if q is not None or p.line.episode_id not in kept_ids:
                wrong.append((p.line.case, "expected ingested", q and q["reasons"]))
        elif p.line.fate == QUARANTINE:
            if q is None:
                wrong.append((p.line.case, "expected quarantined", None))
            elif p.line.reason and not any(p.line.reason in r for r in q["reasons"]):
                wrong.append((p.line.case, f"reason {p.line.reason!r} missing", q["reasons"]))
    assert not wrong, wrong
    cases = Counter(p.line.fate for p in placed)
    assert cases[INGEST] >= 20 and cases[QUARANTINE] >= 70


def test_quarantine_keeps_the_original_bytes(ingested) -> None:
    _, placed, _, _, quarantined = ingested
    data = {(p.file, p.line_no): p.line.data.rstrip(b"\r\n") for p in placed}
    for q in quarantined:
        raw = (
            q["raw"].encode("utf-8")
            if "raw" in q
            else base64.b64decode(q["raw_base64"].encode("ascii"))
        )
        assert raw == data[(q["file"], q["line_no"])]
    assert any("raw_base64" in q for q in quarantined)  # the non-UTF-8 lines


def test_injection_text_is_ingested_verbatim_and_never_executed(ingested) -> None:
    tmp, _, _, kept, _ = ingested
    states = {s.state for t in kept for s in t.steps} | {
        s.next_state for t in kept for s in t.steps
    }
    for text in INJECTIONS:
        assert any(text in s for s in states), text[:40]
    frame = pd.read_parquet(tmp / "ingested" / TRANSITIONS_FILE)
    for text in INJECTIONS:
        assert frame["state"].str.contains(text, regex=False).any(), text[:40]
    # the JSON-looking line inside a string did not become a record of its own
    assert "injected" not in {t.episode_id for t in kept}
    assert INJECTION_EPISODE_ID in {t.episode_id for t in kept}
    assert not list(tmp.rglob(CANARY)) and not (Path.cwd() / CANARY).exists()


def test_injection_rows_stay_inert_downstream(ingested, ci_config, wordllama, tmp_path) -> None:
    """Buffer SQL filters, the grounded teacher and the prompt treat them as plain text."""
    from components.buffer import build_buffer
    from components.buffer.store import ReplayBuffer
    from components.teacher import annotate

    tmp, _, _, kept, _ = ingested
    stats = build_buffer(ci_config, tmp / "ingested" / TRANSITIONS_FILE, tmp_path / "buf",
                         embedder=wordllama)  # fmt: skip
    assert stats["inserted"] == sum(t.n_steps for t in kept if t.split == "train")
    buf = ReplayBuffer.open(tmp_path / "buf", ci_config.buffer, embedder=wordllama)
    victim = next(t for t in kept if t.episode_id == INJECTION_EPISODE_ID)
    # the id holds "' OR '1'='1": a filter built by string pasting would match every row
    hits = buf.retrieve(victim.steps[0], k=len(buf))
    assert hits and all(h.episode_id != INJECTION_EPISODE_ID for h, _ in hits)
    assert len(hits) == len(buf) - victim.n_steps
    got = buf.get([s.id for s in victim.steps])
    assert [s.state for s in got] == [s.state for s in victim.steps]
    assert buf.verify()["rows"] == len(buf)

    # the teacher explains them (format tags in the state never reach the trace)
    out = tmp_path / "annotations.jsonl"
    ann = annotate(ci_config, kept, out, progress=False)
    assert ann["n_annotated"] == sum(t.n_steps for t in kept) and ann["n_failed"] == 0
    for line in out.read_text(encoding="utf-8").splitlines():
        reasoning = json.loads(line)["reasoning"]
        assert "</think>" not in reasoning and "<reward>" not in reasoning

    # the experience-model prompt quotes the state verbatim; a model that parrots the
    # injected tags is a malformed answer, never a reward of 1
    step = victim.steps[0]
    prompt = render_prompt(StepContext(step.instruction, step.state, step.action))
    assert step.state in prompt
    with pytest.raises(MalformedOutputError, match="nested tag"):
        parse_answer(f"<think>ok</think><state>{INJECTIONS[1]}</state><reward>0</reward>")


def test_pathological_states_fail_their_annotation_not_the_run(ci_config, tmp_path) -> None:
    """Valid rows the teacher cannot explain (a trace over its size cap) are recorded failures."""
    from components.teacher import annotate, failures_path_for
    from components.teacher.base import strip_format_tags
    from tests.factories import make_trajectory

    assert strip_format_tags("<thi<think>nk>x</th</think>ink>") == "x"  # no tag rebuilt
    obj = json.loads(make_trajectory(n_steps=3, idx=7).model_dump_json())
    items = ", ".join(f"a {'x' * 3000}{i}" for i in range(3))
    for s in obj["steps"]:
        s["next_state"] = f"Location: Hall\nA room.\nInventory: {items}\nFeedback: ok"
    weird = Trajectory.model_validate(obj)
    normal = make_trajectory(n_steps=2, idx=8)
    out = tmp_path / "annotations.jsonl"
    stats = annotate(ci_config, [weird, normal], out, progress=False)  # does not raise
    assert (stats["n_failed"], stats["n_annotated"]) == (3, 2)
    fails = [json.loads(x) for x in failures_path_for(out).read_text().splitlines()]
    assert [f["id"] for f in fails] == [s.id for s in weird.steps]
    assert all(f["error"].startswith("malformed answer: reasoning longer") for f in fails)
