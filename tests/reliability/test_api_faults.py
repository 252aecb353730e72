"""Case 4, external API faults: a storm of injected faults; finish or fail clearly, never torn.

Runs annotation with the openai teacher against the local fake server
(tests/fakes/openai_server.py) while it injects timeouts, 429s (with and without
Retry-After), 5xx, dropped connections, truncated/slow/non-JSON bodies and malformed
answers. Checked: every transition ends up annotated or in the failures file with a
clear error (never both, never neither); every line of both files parses; retries back
off; the cost budget holds under faults; a server that disappears ends the run instead
of hanging it; a rerun against a healthy server finishes the job with no duplicates.
Single-fault behaviour (each fault retried then answered) is in tests/teacher/test_openai.py.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from components.config import Config, TeacherConfig
from components.teacher import BudgetExhaustedError, annotate, failures_path_for
from tests.fakes import openai_server as fk
from tests.reliability.project import KEY_ENV, make_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
KEY = "sk-reliability-fault-key-000000"
STORM = [*fk.TRANSIENT, fk.RATE_LIMIT_BARE, fk.DROP, fk.SLOW_BODY]
# what the failures file says for a transition whose every attempt hit this fault
ERRORS = ("timeout", "HTTP 429", "HTTP 500", "HTTP 503", "connection error",
          "bad response body", "malformed answer")  # fmt: skip


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


def _config(ci_config: Config, base_url: str, **overrides) -> Config:
    teacher = {
        "backend": "openai",
        "model": "gpt-4o",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "concurrency": 4,
        "max_retries": 3,
        "timeout_s": 1.0,  # 0.4 s could time out a healthy answer on a loaded host
        "backoff_base_s": 0.02,
        "backoff_max_s": 0.1,
        "max_tokens": 64,
        **overrides,
    }
    return ci_config.model_copy(update={"teacher": TeacherConfig(**teacher)})


def _rows(path: Path) -> list[dict]:
    """Every line of a JSONL file, parsed (raises on a torn or corrupt line)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    assert not text or text.endswith("\n"), f"{path} ends mid-line"
    return [json.loads(line) for line in text.splitlines()]


def _storm(seed: int, p_fault: float):
    rng = random.Random(seed)
    lock = threading.Lock()

    def fault(index: int, body: dict) -> str:
        with lock:
            return rng.choice(STORM) if rng.random() < p_fault else fk.OK

    return fault


@pytest.mark.slow
def test_fault_storm_every_transition_annotated_or_failed_then_rerun_completes(
    ci_config, fake_openai, tmp_path: Path
) -> None:
    trajs = make_trajectories(20, steps=4)
    all_ids = [s.id for t in trajs for s in t.steps]
    srv = fake_openai(fault_fn=_storm(0, 0.6), api_key=KEY, delay_s=3.0, retry_after_s=0.05)
    cfg = _config(ci_config, srv.base_url)
    out = tmp_path / "annotations.jsonl"
    start = time.monotonic()
    stats = annotate(cfg, trajs, out, progress=False)
    seconds = time.monotonic() - start

    ok, failed = _rows(out), _rows(failures_path_for(out))
    ok_ids, failed_ids = [r["id"] for r in ok], [r["id"] for r in failed]
    assert len(ok_ids) == len(set(ok_ids)) == stats["n_annotated"]
    assert len(failed_ids) == len(set(failed_ids)) == stats["n_failed"]
    assert not set(ok_ids) & set(failed_ids)
    assert set(ok_ids) | set(failed_ids) == set(all_ids)  # nobody lost
    assert stats["n_failed"] > 0 and stats["n_annotated"] > stats["n_failed"]
    for r in failed:
        assert r["attempts"] == 4 and r["error"].startswith(ERRORS), r["error"]
    seen = Counter(r.fault for r in srv.completion_requests)
    assert set(STORM) <= set(seen)  # every kind of fault was served

    healthy = fake_openai(api_key=KEY)
    healthy_cfg = _config(ci_config, healthy.base_url, timeout_s=5.0)  # no retry: exact counts
    again = annotate(healthy_cfg, trajs, out, progress=False)
    final = [r["id"] for r in _rows(out)]
    assert again["n_annotated"] == len(failed_ids) == len(healthy.completion_requests)
    assert len(final) == len(set(final)) == len(all_ids)
    print(
        f"\n[api faults] {len(all_ids)} transitions, {len(srv.completion_requests)} requests "
        f"({sum(v for k, v in seen.items() if k != fk.OK)} faulted: {dict(seen)}) in "
        f"{seconds:.1f}s: {stats['n_annotated']} annotated, {stats['n_failed']} failed "
        f"(retried by the rerun: {again['n_annotated']}), lost=0 duplicated=0"
    )


def test_retries_back_off_exponentially_and_honour_retry_after(ci_config, fake_openai) -> None:
    from components.teacher import iter_requests
    from components.teacher.openai_teacher import OpenAITeacher

    srv = fake_openai(
        faults=[fk.SERVER_ERROR, fk.DROP, fk.RATE_LIMIT_BARE, fk.RATE_LIMIT],
        api_key=KEY,
        retry_after_s=0.4,
    )
    cfg = _config(
        ci_config, srv.base_url, max_retries=4, backoff_base_s=0.1, backoff_max_s=1, timeout_s=5.0
    )
    teacher = OpenAITeacher(cfg.teacher)
    [ann] = teacher.annotate(list(iter_requests(make_trajectories(1, 1), 2)))
    teacher.close()
    assert ann.ok and ann.attempts == 5
    times = [r.received_at for r in srv.completion_requests]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # equal jitter: the k-th retry waits at least half of min(max, base * 2**k)
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2
    assert gaps[3] >= 0.4  # the server's Retry-After, not the shorter own backoff


def test_budget_holds_under_faults_and_the_error_says_what_to_do(
    ci_config, fake_openai, tmp_path: Path
) -> None:
    srv = fake_openai(fault_fn=_storm(1, 0.5), api_key=KEY, delay_s=3.0, retry_after_s=0.05)
    priced = {"price_input_per_mtok": 1000.0, "price_output_per_mtok": 1000.0}
    cfg = _config(ci_config, srv.base_url, max_cost_usd=1.5, **priced)
    out = tmp_path / "annotations.jsonl"
    with pytest.raises(BudgetExhaustedError) as exc:
        annotate(cfg, make_trajectories(12, steps=4), out, progress=False)
    message = str(exc.value)
    assert "max_cost_usd=1.5" in message and "resumes" in message
    stats = exc.value.stats
    assert stats["cost_usd"] <= 1.5 and stats["budget_exhausted"]
    rows, fails = _rows(out), _rows(failures_path_for(out))  # nothing half-written
    assert len(rows) == stats["n_annotated"] and len(fails) == stats["n_failed"]
    # exactly the usage of the bodies that reached the client whole is accounted
    whole = [u for u in srv.served_usage if u["fault"] in (fk.OK, fk.MALFORMED, fk.LENGTH)]
    assert stats["prompt_tokens"] == sum(u["prompt_tokens"] for u in whole)
    assert stats["completion_tokens"] == sum(u["completion_tokens"] for u in whole)


def test_server_gone_mid_run_ends_the_run_with_clear_errors(
    ci_config, fake_openai, tmp_path: Path
) -> None:
    trajs = make_trajectories(10, steps=4)
    all_ids = [s.id for t in trajs for s in t.steps]
    servers: list[fk.FakeOpenAIServer] = []

    def stop_after_five(index: int, body: dict) -> str:
        if index == 4:  # the server goes away: no new connections from here on
            threading.Thread(target=servers[0].stop, daemon=True).start()
        # and the connections already open die without an answer
        return fk.OK if index <= 4 else fk.DROP

    srv = fake_openai(fault_fn=stop_after_five, api_key=KEY)
    servers.append(srv)
    cfg = _config(ci_config, srv.base_url, max_retries=2)
    out = tmp_path / "annotations.jsonl"
    start = time.monotonic()
    stats = annotate(cfg, trajs, out, progress=False)
    assert time.monotonic() - start < 60  # no hang
    fails = _rows(failures_path_for(out))
    assert stats["n_annotated"] + stats["n_failed"] == len(all_ids)
    assert 1 <= stats["n_annotated"] <= 5
    assert fails and all(f["error"].startswith(("connection error", "timeout")) for f in fails)
    assert not stats["complete"]
