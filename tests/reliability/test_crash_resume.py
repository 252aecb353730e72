"""Case 2, crash and resume: kill -9 mid-run, rerun, nothing lost and nothing duplicated.

- collection: tests/integration/test_collect.py::test_resume_after_kill_loses_and_duplicates
  _nothing kills the collector (not repeated here); test_env_faults.py kills one of its
  worker processes mid-run and the same call finishes.
- annotation: the real ``dreamgym annotate`` CLI with the openai backend against the local
  fake server answering slowly, killed after a few annotations, then rerun.
- buffer ingest: a process appending transitions to the LanceDB buffer chunk by chunk,
  killed twice at random points, then ``build_buffer`` completes it.
- RL training: ``train_rl`` (GRPO and PPO, a tiny policy on real TextWorld games) killed
  after a checkpoint, then rerun: it resumes from the last checkpoint, the round counter
  goes on, history.jsonl has every round exactly once, the real-step count is exact, and
  the final weights equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from components.buffer import build_buffer
from components.buffer.store import ReplayBuffer
from components.config import BufferConfig
from components.schema import write_jsonl
from components.teacher import failures_path_for
from tests.fakes import openai_server as fk
from tests.reliability.project import (
    KEY_ENV,
    TEACHER_CONCURRENCY,
    child_env,
    cli_args,
    complete_ids,
    count_lines,
    kill9,
    last_json,
    make_project,
    make_trajectories,
    openai_teacher,
    python_argv,
    spawn,
    wait_until,
    write_params,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


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
    assert 0 <= paid_but_lost <= TEACHER_CONCURRENCY
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


def _rounds(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^ROUND (\d+) ", text, re.MULTILINE)]


def rl_argv(*args: str) -> list[str]:
    """argv of the RL trainer child (tests/reliability/rl_trainer.py)."""
    return [sys.executable, "-m", "tests.reliability.rl_trainer", *args]


def _summary(text: str) -> dict:
    return json.loads(text.split("SUMMARY ", 1)[1].splitlines()[0])


def _weights(policy_dir: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    from components.agent.scorer import WEIGHTS_FILE

    if (policy_dir / WEIGHTS_FILE).exists():  # a scoring policy
        return torch.load(policy_dir / WEIGHTS_FILE, weights_only=True)
    return load_file(str(policy_dir / "model.safetensors"))


@pytest.mark.slow
# both algorithms, both policy kinds: the cpu profile's scorer and the gpu profile's LM
@pytest.mark.parametrize(("algo", "kind"), [("grpo", "scorer"), ("ppo", "lm")])
def test_rl_training_killed_after_a_checkpoint_resumes_from_it(
    tw_suite, tmp_path: Path, algo: str, kind: str
) -> None:
    from components.agent import checkpoint

    out, ledger = tmp_path / "run", tmp_path / "ledger.txt"
    argv = rl_argv(str(tw_suite.root), str(out), str(ledger), algo, kind, "0.4")
    first_log = tmp_path / "first.log"
    proc = spawn(argv, child_env(), first_log)
    try:
        # kill -9 once round 2 is checkpointed (ckpt-2 appears by an atomic rename)
        wait_until(
            lambda: (out / "checkpoints" / "ckpt-2").is_dir(),
            proc,
            timeout=240,
            what="the round-2 checkpoint",
        )
        kill9(proc)
    finally:
        if proc.poll() is None:
            kill9(proc)
    first = first_log.read_text()
    latest = checkpoint.latest(out / "checkpoints")
    assert latest is not None
    resumed_at = int(latest.name.removeprefix(checkpoint.PREFIX))
    logged_before = _rounds(first)
    assert 2 <= resumed_at <= max(logged_before) < 6, first[-2000:]
    assert not (out / "policy").exists()  # the kill came before the end

    second_log = tmp_path / "second.log"
    proc = spawn(argv, child_env(), second_log)
    assert proc.wait(timeout=300) == 0, second_log.read_text()[-3000:]
    second = second_log.read_text()
    summary = _summary(second)

    # resumed from the checkpoint: the round counter goes on from it
    assert summary["resumed"] == 1 and summary["iterations"] == 6
    assert _rounds(second) == list(range(resumed_at + 1, 7))
    rows = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    iterations = [int(r["iteration"]) for r in rows]
    assert iterations == [1, 2, 3, 4, 5, 6]  # no round missing, none twice

    # the real-step count is exact: each kept round booked what its own process stepped
    pids = [int(line.split()[0]) for line in ledger.read_text().splitlines()]
    first_pid, second_pid = pids[0], pids[-1]
    steps = Counter(tuple(map(int, line.split())) for line in ledger.read_text().splitlines())
    for row in rows:
        i = int(row["iteration"])
        pid = first_pid if i <= resumed_at else second_pid
        assert row["real_steps_round"] == steps[(pid, i - 1)], (i, row)
    assert (
        summary["real_steps"] == rows[-1]["real_steps"] == sum(r["real_steps_round"] for r in rows)
    )
    redone = [i for i in logged_before if i > resumed_at]  # logged, killed before its checkpoint
    lost_steps = sum(n for (pid, it), n in steps.items() if pid == first_pid and it >= resumed_at)

    # the resumed run ends with the same weights as an uninterrupted one
    straight_out = tmp_path / "straight"
    straight_log = tmp_path / "straight.log"
    straight = spawn(
        rl_argv(str(tw_suite.root), str(straight_out), str(tmp_path / "l2"), algo, kind, "0"),
        child_env(),
        straight_log,
    )
    assert straight.wait(timeout=300) == 0, straight_log.read_text()[-3000:]
    assert _summary(straight_log.read_text())["real_steps"] == summary["real_steps"]
    a, b = _weights(out / "policy"), _weights(straight_out / "policy")
    assert a.keys() == b.keys() and all(torch_equal(a[k], b[k]) for k in a)
    print(
        f"\n[crash/rl-{algo}-{kind}] 6 rounds, killed after round {max(logged_before)} logged "
        f"(checkpoint {resumed_at}), rerun did rounds {resumed_at + 1}-6: "
        f"rounds redone={len(redone)}, lost=0 duplicated=0, real steps {summary['real_steps']} "
        f"exact (uncheckpointed steps re-run: {lost_steps}), weights = uninterrupted run"
    )


def torch_equal(x, y) -> bool:
    """Exact tensor equality."""
    import torch

    return bool(torch.equal(x, y))
