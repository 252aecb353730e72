"""Case 2, crash and resume: kill -9 mid-run, rerun, nothing lost and nothing duplicated.

- collection: tests/integration/test_collect.py::test_resume_after_kill_loses_and_duplicates
  _nothing kills the collector (not repeated here); test_env_faults.py kills one of its
  worker processes mid-run and the same call finishes.
- annotation: the real ``dreamgym annotate`` CLI with the openai backend against the local
  fake server answering slowly, killed after a few annotations, then rerun.
- buffer ingest: a process appending transitions to the LanceDB buffer chunk by chunk,
  killed twice at random points, then ``build_buffer`` completes it.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from components.buffer import build_buffer
from components.buffer.store import ReplayBuffer
from components.config import BufferConfig
from components.schema import write_jsonl
from components.teacher import failures_path_for
from tests.fakes import openai_server as fk
from tests.reliability.project import (
    child_env,
    cli_args,
    complete_ids,
    count_lines,
    kill9,
    last_json,
    make_project,
    make_trajectories,
    python_argv,
    spawn,
    wait_until,
    write_params,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
KEY_ENV = "DREAMGYM_RELIABILITY_KEY"
CONCURRENCY = 2


def openai_teacher(base_url: str) -> dict:
    """params.yaml overrides: the openai teacher on a local server, test-sized limits."""
    return {
        "teacher": {
            "backend": "openai",
            "model": "gpt-4o",
            "base_url": base_url,
            "api_key_env": KEY_ENV,
            "concurrency": CONCURRENCY,
            "max_retries": 2,
            "timeout_s": 10.0,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "max_tokens": 64,
        }
    }


@pytest.mark.slow
def test_annotate_cli_killed_mid_run_resumes_without_loss_or_duplicates(
    tmp_path: Path, fake_openai
) -> None:
    trajs = make_trajectories(16, steps=5)
    all_ids = [s.id for t in trajs for s in t.steps]
    slow = fake_openai(fault_fn=lambda i, body: fk.DELAY, delay_s=0.15, api_key="sk-test-1")
    _, paths = make_project(tmp_path, overrides=openai_teacher(slow.base_url))
    write_jsonl(paths.trajectories_file, trajs)
    out = paths.annotations_file
    env = child_env({KEY_ENV: "sk-test-1"})

    proc = spawn(cli_args(tmp_path, "annotate"), env, tmp_path / "first.log")
    try:
        wait_until(lambda: count_lines(out) >= 6, proc, timeout=180, what="6 annotations")
        kill9(proc)
    finally:
        if proc.poll() is None:
            kill9(proc)
    before = complete_ids(out)
    assert 6 <= len(before) < len(all_ids)
    paid_but_lost = len(slow.completion_requests) - len(before)
    with out.open("a") as f:
        f.write('{"id": "torn')  # as if the kill had cut a line in half

    fast = fake_openai(api_key="sk-test-1")
    write_params(tmp_path, openai_teacher(fast.base_url))
    log = tmp_path / "second.log"
    proc = spawn(cli_args(tmp_path, "annotate"), env, log)
    assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    stats = last_json(log.read_text())

    after = [json.loads(line)["id"] for line in out.read_text().splitlines()]  # all parse
    assert after[: len(before)] == before  # append-only
    assert len(after) == len(set(after)) == len(all_ids)  # duplicated = 0
    assert set(after) == set(all_ids)  # lost = 0
    assert stats["n_skipped_existing"] == len(before)
    assert stats["n_annotated"] == len(all_ids) - len(before) == len(fast.completion_requests)
    assert count_lines(failures_path_for(out)) == 0
    # only the requests in flight at the kill were paid for and not kept
    assert 0 <= paid_but_lost <= CONCURRENCY
    print(
        f"\n[crash/annotate] {len(all_ids)} transitions, killed after {len(before)}, "
        f"rerun annotated {stats['n_annotated']}: lost=0 duplicated=0, "
        f"requests paid but lost at the kill={paid_but_lost}"
    )


APPENDER = """
import sys
from pathlib import Path
from components.buffer import ReplayBuffer, WordLlamaEmbedder
from components.config import BufferConfig
from components.schema import Transition
rows = [Transition.model_validate_json(x) for x in Path(sys.argv[1]).read_text().splitlines()]
buf = ReplayBuffer.open(Path(sys.argv[2]), BufferConfig(embedder="wordllama"),
                        embedder=WordLlamaEmbedder())
for i in range(0, len(rows), 20):
    r = buf.add(rows[i : i + 20])
    print("ADDED", i + 20, r.inserted, flush=True)
"""


@pytest.mark.slow
def test_buffer_ingest_killed_twice_then_completed(tmp_path: Path, ci_config, wordllama) -> None:
    steps = [s for t in make_trajectories(120, steps=4) for s in t.steps]
    src = tmp_path / "transitions.jsonl"
    write_jsonl(src, steps)
    buffer_dir = tmp_path / "buffer"
    rng = random.Random(0)
    for kill_at in (2, 5):  # chunks committed before the kill lands
        log = tmp_path / f"append-{kill_at}.log"
        proc = spawn(python_argv(APPENDER, str(src), str(buffer_dir)), child_env(), log)
        try:
            wait_until(
                lambda log=log, k=kill_at: log.read_text().count("ADDED") >= k,
                proc,
                what=f"{kill_at} chunks",
            )
            time.sleep(rng.uniform(0, 0.05))  # land anywhere in the next chunk
            kill9(proc)
        finally:
            if proc.poll() is None:
                kill9(proc)

    cfg = BufferConfig(embedder="wordllama")
    partial = len(ReplayBuffer.open(buffer_dir, cfg, embedder=wordllama))
    assert 40 <= partial < len(steps)
    stats = build_buffer(ci_config, steps, buffer_dir, embedder=wordllama)
    assert stats["already_present"] == partial
    assert stats["inserted"] == len(steps) - partial
    buf = ReplayBuffer.open(buffer_dir, cfg, embedder=wordllama)
    ids = buf.to_arrow()["id"].to_pylist()
    assert len(ids) == len(set(ids)) == len({s.id for s in steps})  # lost = duplicated = 0
    assert buf.verify()["rows"] == len(steps)
    assert buf.tags()["seed"] == buf.version
    print(
        f"\n[crash/buffer] {len(steps)} transitions, 2 kills, {partial} rows survived, "
        f"{stats['inserted']} added on rerun: lost=0 duplicated=0, verify() ok"
    )
