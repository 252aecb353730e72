"""OpenAI backend against a real local HTTP server with injected faults."""

from __future__ import annotations

import itertools
import json
import logging
import traceback
from email.utils import formatdate

import pytest

from components.config import TeacherConfig
from components.teacher import (
    AnnotationRequest,
    BudgetExhaustedError,
    TeacherError,
    annotate,
    failures_path_for,
    iter_requests,
)
from components.teacher.openai_teacher import (
    OpenAITeacher,
    Price,
    Redactor,
    _retry_after_s,
    resolve_price,
)
from tests.fakes import openai_server as fk
from tests.teacher.conftest import (
    KEY_ENV,
    make_config,
    make_trajectories,
    openai_teacher_config,
)

pytestmark = pytest.mark.timeout(60)
ANSWERED = {fk.OK, fk.MALFORMED, fk.LENGTH}  # faults whose body reached the client whole


def requests(n_traj: int = 1, steps: int = 1) -> list[AnnotationRequest]:
    return list(iter_requests(make_trajectories(n_traj, steps), history_len=2))


def billed_usage(srv: fk.FakeOpenAIServer) -> tuple[int, int]:
    rows = [u for u in srv.served_usage if u["fault"] in ANSWERED]
    return sum(u["prompt_tokens"] for u in rows), sum(u["completion_tokens"] for u in rows)


def test_success_path_with_token_and_cost_accounting(api_key, fake_openai, tmp_path) -> None:
    srv = fake_openai(api_key=api_key)
    cfg = make_config(
        **openai_teacher_config(
            srv.base_url, price_input_per_mtok=2.5, price_output_per_mtok=10.0
        ).model_dump()
    )
    trajs = make_trajectories(3, 4)
    out = tmp_path / "annotations.jsonl"
    stats = annotate(cfg, trajs, out, progress=False)

    assert stats["n_annotated"] == 12 and stats["n_failed"] == 0 and stats["complete"]
    p_tok, c_tok = billed_usage(srv)
    assert (stats["prompt_tokens"], stats["completion_tokens"]) == (p_tok, c_tok)
    assert stats["tokens"] == p_tok + c_tok
    assert stats["cost_usd"] == pytest.approx((p_tok * 2.5 + c_tok * 10.0) / 1e6)

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    by_id = {t.id: t for tr in trajs for t in tr.steps}
    for r in rows:
        assert set(r) == {
            "id",
            "reasoning",
            "backend",
            "model",
            "prompt_tokens",
            "completion_tokens",
        }
        assert r["backend"] == "openai" and r["model"] == "gpt-4o"
        # The answer echoes the request's action: no mix-up across concurrent requests.
        assert by_id[r["id"]].action in r["reasoning"]
    assert sum(r["prompt_tokens"] for r in rows) == p_tok

    reqs = srv.completion_requests
    assert len(reqs) == 12
    for rec in reqs:
        assert rec.headers["authorization"] == f"Bearer {api_key}"
        assert rec.body["model"] == "gpt-4o" and rec.body["max_tokens"] == 64
        assert rec.body["messages"][0]["role"] == "system"


@pytest.mark.parametrize("fault", fk.TRANSIENT)
def test_each_fault_is_retried_then_succeeds(api_key, fake_openai, fault) -> None:
    # a 1 s timeout: a loaded 2-core CI machine can take 0.3 s to answer a healthy request
    srv = fake_openai(faults=[fault, fault], api_key=api_key, delay_s=3.0, retry_after_s=0.2)
    cfg = openai_teacher_config(srv.base_url, timeout_s=1.0, max_retries=2, concurrency=1)
    teacher = OpenAITeacher(cfg)
    [ann] = teacher.annotate(requests())
    teacher.close()

    assert ann.ok, ann.error
    assert ann.attempts == 3
    assert [r.fault for r in srv.completion_requests] == [fault, fault, fk.OK]
    p_tok, c_tok = billed_usage(srv)  # tokens of malformed answers are billed too
    assert (ann.prompt_tokens, ann.completion_tokens) == (p_tok, c_tok)
    temps = [r.body["temperature"] for r in srv.completion_requests]
    # Only a malformed answer is re-sampled; transport retries resend the same request.
    assert temps == ([0.0, 0.7, 0.7] if fault in (fk.MALFORMED, fk.LENGTH) else [0.0] * 3)
    if fault == fk.RATE_LIMIT:
        times = [r.received_at for r in srv.completion_requests]
        assert all(b - a >= 0.2 for a, b in itertools.pairwise(times))


def test_retries_exhausted_is_a_recorded_failure(api_key, fake_openai, tmp_path) -> None:
    srv = fake_openai(faults=[fk.SERVER_ERROR] * 3, api_key=api_key)
    cfg = make_config(
        **openai_teacher_config(srv.base_url, max_retries=2, concurrency=1).model_dump()
    )
    out = tmp_path / "a.jsonl"
    stats = annotate(cfg, make_trajectories(1, 2), out, progress=False)
    assert stats["n_failed"] == 1 and stats["n_annotated"] == 1 and not stats["complete"]
    [fail] = [json.loads(x) for x in failures_path_for(out).read_text().splitlines()]
    assert fail["error"].startswith("HTTP 500") and fail["attempts"] == 3
    assert fail["id"] not in out.read_text()

    # The next run retries the failed transition only.
    stats = annotate(cfg, make_trajectories(1, 2), out, progress=False)
    assert (stats["n_annotated"], stats["n_skipped_existing"], stats["n_failed"]) == (1, 1, 0)
    assert len(out.read_text().splitlines()) == 2


def test_malformed_answers_are_counted_never_guessed(api_key, fake_openai, tmp_path) -> None:
    srv = fake_openai(fault_fn=lambda i, body: fk.MALFORMED, api_key=api_key)
    cfg = make_config(**openai_teacher_config(srv.base_url, max_retries=1).model_dump())
    out = tmp_path / "a.jsonl"
    stats = annotate(cfg, make_trajectories(2, 2), out, progress=False)
    assert stats["n_failed"] == 4 and stats["n_annotated"] == 0
    assert out.read_text() == ""
    fails = [json.loads(x) for x in failures_path_for(out).read_text().splitlines()]
    assert len(fails) == 4
    for f in fails:
        assert f["error"].startswith("malformed answer") and f["attempts"] == 2
        assert f["raw"].startswith("The action leads")
        assert f["completion_tokens"] > 0
    assert len(srv.completion_requests) == 8


def test_bad_request_fails_without_retry(api_key, fake_openai) -> None:
    srv = fake_openai(faults=[fk.BAD_REQUEST], api_key=api_key)
    teacher = OpenAITeacher(openai_teacher_config(srv.base_url))
    [ann] = teacher.annotate(requests())
    assert ann.status == "failed" and ann.attempts == 1 and "HTTP 400" in ann.error
    assert len(srv.completion_requests) == 1


def test_budget_exhausted_stops_cleanly_and_resumes(api_key, fake_openai, tmp_path) -> None:
    srv = fake_openai(api_key=api_key)
    # $1 per 1K tokens: a request costs ~$0.19 and is budgeted at its worst case (~$0.4).
    priced = {"price_input_per_mtok": 1000.0, "price_output_per_mtok": 1000.0}
    cfg = make_config(
        **openai_teacher_config(
            srv.base_url, concurrency=2, max_cost_usd=2.0, **priced
        ).model_dump()
    )
    trajs = make_trajectories(3, 4)
    out = tmp_path / "a.jsonl"
    with pytest.raises(BudgetExhaustedError, match=r"max_cost_usd=2\.0") as exc:
        annotate(cfg, trajs, out, progress=False)
    stats = exc.value.stats
    assert 2 <= stats["n_annotated"] < 12 and stats["budget_exhausted"]
    assert stats["cost_usd"] <= 2.0
    assert stats["n_failed"] == 0 and not failures_path_for(out).read_text()
    rows = [json.loads(x) for x in out.read_text().splitlines()]  # every line whole
    assert len(rows) == stats["n_annotated"] == len(srv.completion_requests)

    cfg2 = make_config(**openai_teacher_config(srv.base_url, **priced).model_dump())
    stats2 = annotate(cfg2, trajs, out, progress=False)
    assert stats2["n_skipped_existing"] == stats["n_annotated"]
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 12
    assert len(srv.completion_requests) == 12  # nothing was paid for twice


def test_auth_failure_stops_the_run_and_is_redacted(api_key, fake_openai, tmp_path) -> None:
    srv = fake_openai(faults=[fk.UNAUTHORIZED_ECHO], api_key=api_key)
    cfg = make_config(**openai_teacher_config(srv.base_url, concurrency=1).model_dump())
    with pytest.raises(TeacherError, match="HTTP 401") as exc:
        annotate(cfg, make_trajectories(1, 3), tmp_path / "a.jsonl", progress=False)
    text = "".join(traceback.format_exception(exc.value))
    assert "Bearer ***" in text
    assert api_key not in text
    assert len(srv.completion_requests) == 1  # no hammering with a bad key


def test_key_never_leaks(api_key, fake_openai, tmp_path, caplog, capsys) -> None:
    caplog.set_level(logging.DEBUG)  # also the openai/httpx debug logs
    faults = [fk.RATE_LIMIT, fk.SERVER_ERROR, fk.TRUNCATED, fk.NON_JSON]
    faults += [fk.MALFORMED] * 3 + [fk.DELAY]
    srv = fake_openai(faults=faults, api_key=api_key, delay_s=3.0, retry_after_s=0.05)
    cfg = make_config(
        **openai_teacher_config(srv.base_url, timeout_s=1.0, max_retries=2).model_dump()
    )
    out = tmp_path / "a.jsonl"
    teacher = OpenAITeacher(cfg.teacher)
    stats = annotate(cfg, make_trajectories(2, 3), out, teacher=teacher, progress=True)
    teacher.close()
    with pytest.raises(TeacherError) as exc:
        srv.push_faults(fk.UNAUTHORIZED_ECHO)
        OpenAITeacher(cfg.teacher).annotate(requests())
    captured = capsys.readouterr()
    haystacks = {
        "logs": caplog.text,
        "stdout": captured.out,
        "stderr": captured.err,
        "stats": json.dumps(stats),
        "annotations": out.read_text(),
        "failures": failures_path_for(out).read_text(),
        "repr": repr(teacher) + repr(teacher.__dict__.get("_redact")),
        "error": "".join(traceback.format_exception(exc.value)),
    }
    assert "retry" in caplog.text  # the faults were logged, redacted
    for name, text in haystacks.items():
        assert api_key not in text, name
    assert all(r.headers["authorization"] == f"Bearer {api_key}" for r in srv.requests)


def test_missing_key_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    cfg = TeacherConfig(backend="openai", api_key_env=KEY_ENV)
    with pytest.raises(TeacherError, match=KEY_ENV):
        OpenAITeacher(cfg)


def test_budget_needs_a_known_price(api_key) -> None:
    cfg = TeacherConfig(
        backend="openai", model="my-vllm-model", base_url="http://127.0.0.1:9/v1",
        api_key_env=KEY_ENV, max_cost_usd=1.0,
    )  # fmt: skip
    with pytest.raises(TeacherError, match="price"):
        OpenAITeacher(cfg)


def test_price_table_and_overrides() -> None:
    assert resolve_price(TeacherConfig(model="gpt-4o")) == Price(2.5, 10.0)
    assert resolve_price(TeacherConfig(model="gpt-4o-2024-08-06")) == Price(2.5, 10.0)
    assert resolve_price(TeacherConfig(model="gpt-4o-mini-2024-07-18")) == Price(0.15, 0.6)
    assert resolve_price(TeacherConfig(model="local-llama")) is None
    over = TeacherConfig(model="gpt-4o", price_output_per_mtok=1.0)
    assert resolve_price(over) == Price(2.5, 1.0)
    assert Price(2.5, 10.0).cost(1_000_000, 100_000) == pytest.approx(3.5)


def test_retry_after_parsing_and_redactor() -> None:
    assert _retry_after_s({"retry-after": "2"}) == 2.0
    assert _retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert 0 <= _retry_after_s({"retry-after": formatdate(usegmt=True)}) <= 1
    assert _retry_after_s({"retry-after": "soon"}) is None
    red = Redactor("sk-abcdef123456")
    assert red("key sk-abcdef123456 and Bearer xyz.123") == "key *** and Bearer ***"
    assert "sk-zzz" not in red("other sk-zzzzzzzzzz key")


def test_a_key_at_the_excerpts_cut_is_redacted_whole() -> None:
    # redacting after the 300-character cut left the key's head in the failures file
    from types import SimpleNamespace

    from components.teacher.base import answer

    key = "gsk_live_7f3a9c2e5b8d1f4a6c0e"
    raw = "x" * 290 + key + " tail"
    teacher = SimpleNamespace(backend="openai", model="m")
    ann = answer(requests()[0], "failed", teacher, (1, 1), 1, raw=raw, redact=Redactor(key))
    assert ann.raw is not None and key[:6] not in ann.raw and ann.raw.startswith("x" * 290)


def test_fake_server_rejects_unknown_faults() -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        fk.FakeOpenAIServer(faults=["boom"])


def test_request_body_and_path(api_key, fake_openai) -> None:
    srv = fake_openai(api_key=api_key)
    teacher = OpenAITeacher(openai_teacher_config(srv.base_url))
    teacher.annotate(requests())
    [rec] = srv.requests
    assert rec.path == "/v1/chat/completions" and rec.method == "POST"
    user = rec.body["messages"][1]["content"]
    assert "Action (a_t): go east 0-0" in user and "Reward: 1" in user
    # the configured model, a system prompt first, and the answer length capped
    body = rec.body
    assert body["model"] == "gpt-4o" and body["messages"][0]["role"] == "system"
    assert body.get("max_tokens", body.get("max_completion_tokens")) == 64


def test_a_key_echoed_in_a_successful_answer_is_redacted(api_key, fake_openai, tmp_path) -> None:
    # a misconfigured proxy or model server that reflects the credentials in a 200 answer
    from urllib.parse import quote

    def echo(body: dict) -> str:
        return f"<think>key={api_key} url={quote(api_key, safe='')} auth=Bearer {api_key}</think>"

    srv = fake_openai(api_key=api_key, answer_fn=echo)
    cfg = make_config(**openai_teacher_config(srv.base_url).model_dump())
    out = tmp_path / "a.jsonl"
    teacher = OpenAITeacher(cfg.teacher)
    annotate(cfg, make_trajectories(1, 2), out, teacher=teacher, progress=False)
    teacher.close()
    text = out.read_text()
    assert "key=" in text and api_key not in text and quote(api_key, safe="") not in text
