"""Case 8, concurrency: two processes appending to one LanceDB buffer lose nothing.

Two real processes start together (a file barrier) on the same buffer directory, even
before it exists, and append chunks of transitions with ``ReplayBuffer.add``; half of
their rows overlap. Afterwards: row count = size of the union, ids unique, every row
readable (``verify``), and each process's own view of what it added adds up.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from components.buffer.store import ReplayBuffer
from components.config import BufferConfig
from components.schema import write_jsonl
from tests.reliability.project import (
    child_env,
    make_trajectories,
    python_argv,
    spawn,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
CHUNK = 5

WRITER = """
import json, sys, time
from pathlib import Path
from components.buffer import ReplayBuffer, WordLlamaEmbedder
from components.config import BufferConfig
from components.schema import Transition
rows = [Transition.model_validate_json(x) for x in Path(sys.argv[1]).read_text().splitlines()]
buffer_dir, go, chunk = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
emb = WordLlamaEmbedder()
emb.embed(["warm up"])
print("READY", flush=True)
while not go.exists():
    time.sleep(0.005)
buf = ReplayBuffer.open(buffer_dir, BufferConfig(embedder="wordllama"), embedder=emb)
inserted = present = 0
for i in range(0, len(rows), chunk):
    r = buf.add(rows[i : i + chunk])
    inserted += r.inserted
    present += r.already_present
    buf.refresh()
print("RESULT " + json.dumps({"inserted": inserted, "present": present, "n": len(rows)}))
"""


@pytest.mark.slow
def test_two_writers_at_once_lose_and_duplicate_nothing(tmp_path: Path, wordllama) -> None:
    steps = [s for t in make_trajectories(80, steps=4) for s in t.steps]
    half = len(steps) // 2
    # half of the rows overlap; b walks backwards, so the writers meet in the middle
    shares = {"a": steps[: half + half // 2], "b": steps[half // 2 :][::-1]}
    union = {s.id for s in steps}
    buffer_dir, go = tmp_path / "buffer", tmp_path / "go"
    procs, logs = {}, {}
    for name, rows in shares.items():
        src = tmp_path / f"{name}.jsonl"
        write_jsonl(src, rows)
        logs[name] = tmp_path / f"{name}.log"
        argv = python_argv(WRITER, str(src), str(buffer_dir), str(go), str(CHUNK))
        procs[name] = spawn(argv, child_env(), logs[name])
    try:
        for name, proc in procs.items():
            wait_until(lambda n=name: b"READY" in logs[n].read_bytes(), proc, what=f"{name}")
        go.touch()  # both race from here, the table's creation included
        start = time.monotonic()
        codes = {name: proc.wait(timeout=180) for name, proc in procs.items()}
        seconds = time.monotonic() - start
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert codes == {"a": 0, "b": 0}, {n: p.read_text()[-2000:] for n, p in logs.items()}
    results = {
        n: json.loads(p.read_text().split("RESULT ", 1)[1].splitlines()[0]) for n, p in logs.items()
    }

    buf = ReplayBuffer.open(buffer_dir, BufferConfig(embedder="wordllama"), embedder=wordllama)
    ids = buf.to_arrow()["id"].to_pylist()
    assert len(ids) == len(set(ids)) == len(union), "lost or duplicated rows"
    assert set(ids) == union
    assert buf.verify()["rows"] == len(union)
    # every row was inserted by exactly one writer; the other saw it as present
    assert sum(r["inserted"] for r in results.values()) == len(union)
    for r in results.values():
        assert r["inserted"] + r["present"] == r["n"]
    print(
        f"\n[concurrency] 2 writers x {CHUNK}-row chunks, {len(shares['a'])} + "
        f"{len(shares['b'])} rows offered, {len(union)} unique: count={len(ids)} "
        f"lost=0 duplicated=0 in {seconds:.1f}s; inserted a={results['a']['inserted']} "
        f"b={results['b']['inserted']}"
    )
