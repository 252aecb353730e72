"""The openai judge against a real local OpenAI-compatible HTTP server (fault injection)."""

from __future__ import annotations

import json

import pytest

from components.evaluation.judge import (
    CRITERIA,
    SYSTEM_PROMPT,
    JudgeError,
    OpenAIJudge,
    make_judge,
    run_judge,
)
from tests.evaluation.conftest import KEY_ENV, judge_config
from tests.factories import make_trajectory
from tests.fakes import openai_server as fk

pytestmark = pytest.mark.timeout(60)


def synthetic(n_steps: int, idx: int = 0):
    traj = make_trajectory(n_steps=n_steps, idx=idx, task_id=f"tw-quest-{idx}")
    steps = [s.model_copy(update={"source": "synthetic"}) for s in traj.steps]
    return traj.model_copy(update={"source": "synthetic", "steps": steps})


def test_verdicts_are_parsed_per_trajectory_and_aggregated(api_key, fake_openai):
    srv = fake_openai(api_key=api_key, answer_fn=fk.judge_answer)
    judge = make_judge(judge_config(backend="openai", base_url=srv.base_url))
    trajs = [synthetic(1, 0), synthetic(2, 1), synthetic(3, 2)]
    out = judge.judge(trajs)
    # fake verdicts encode the steps shown: consistency = n % 3, informativeness = (n+1) % 3
    assert [r["consistency"] for r in out.rows] == [1, 2, 0]
    assert [r["informativeness"] for r in out.rows] == [2, 0, 1]
    assert all(r["status"] == "ok" and r["attempts"] == 1 for r in out.rows)
    assert out.rows[1]["rationale"] == "2 steps judged"
    s = out.summary
    assert s["n"] == 3 and s["n_failed"] == 0 and s["n_malformed"] == 0
    assert s["consistency"]["mean"] == 1.0 and s["hallucination"]["mean"] == 2.0
    assert s["consistency"]["distribution"] == {"0": 1, "1": 1, "2": 1}
    assert s["prompt_tokens"] > 0 and s["completion_tokens"] > 0
    reqs = srv.completion_requests
    assert len(reqs) == 3
    assert all(r.headers["authorization"] == f"Bearer {api_key}" for r in reqs)
    assert reqs[0].body["messages"][0]["content"] == SYSTEM_PROMPT
    assert reqs[0].body["model"] == "gpt-4o"
    # the key is sent, never kept
    assert api_key not in json.dumps([out.summary, out.rows], default=str)


def test_malformed_answers_are_resampled_then_counted(api_key, fake_openai):
    # trajectory 1: malformed then fine; trajectory 2: malformed on every attempt
    def fault(index: int, body: dict) -> str:
        return fk.MALFORMED if "go east 1" not in json.dumps(body) else fk.OK

    srv = fake_openai(api_key=api_key, answer_fn=fk.judge_answer, fault_fn=fault)
    srv.push_faults(fk.MALFORMED)  # the very first request, whichever it is
    judge = OpenAIJudge(judge_config(backend="openai", base_url=srv.base_url, concurrency=1))
    ok_traj = synthetic(2, 0)  # its actions contain "go east 1"
    bad_traj = synthetic(1, 1)  # only "go east 0": always malformed
    out = judge.judge([ok_traj, bad_traj])
    ok_row, bad_row = out.rows
    assert ok_row["status"] == "ok" and ok_row["attempts"] == 2 and not ok_row["malformed"]
    assert bad_row["status"] == "failed" and bad_row["malformed"]
    assert bad_row["attempts"] == 3  # 1 + max_retries
    assert bad_row["error"].startswith("malformed answer") and bad_row["raw"]
    assert all(bad_row[c] is None for c in CRITERIA)
    s = out.summary
    assert (s["n"], s["n_failed"], s["n_malformed"], s["n_retried"]) == (1, 1, 1, 2)
    assert s["attempts"] == 5
    assert s["consistency"]["n"] == 1  # the failed trajectory is not scored


def test_out_of_rubric_scores_are_malformed_and_retried(api_key, fake_openai):
    answers = iter(
        [
            '{"consistency": 3, "diversity": 2, "informativeness": 1, "hallucination": 2}',
            '{"consistency": 2, "diversity": 2, "informativeness": 1, "hallucination": 1}',
        ]
    )
    srv = fake_openai(api_key=api_key, answer_fn=lambda body: next(answers))
    judge = OpenAIJudge(judge_config(backend="openai", base_url=srv.base_url))
    (row,) = judge.judge([synthetic(2)]).rows
    assert row["status"] == "ok" and row["attempts"] == 2 and row["consistency"] == 2
    # a re-sample is asked at a higher temperature, not the greedy answer again
    temps = [r.body["temperature"] for r in srv.completion_requests]
    assert temps[0] == 0.0 and temps[1] > 0


def test_transient_http_faults_are_retried(api_key, fake_openai):
    srv = fake_openai(
        faults=[fk.SERVER_ERROR, fk.RATE_LIMIT, fk.TRUNCATED_JSON],
        api_key=api_key,
        answer_fn=fk.judge_answer,
        retry_after_s=0.01,
    )
    judge = OpenAIJudge(
        judge_config(backend="openai", base_url=srv.base_url, max_retries=3, concurrency=1)
    )
    (row,) = judge.judge([synthetic(3)]).rows
    assert row["status"] == "ok" and row["attempts"] == 4 and row["consistency"] == 0


def test_budget_stops_cleanly_and_skips_the_rest(api_key, fake_openai):
    srv = fake_openai(api_key=api_key, answer_fn=fk.judge_answer)
    cfg = judge_config(
        backend="openai",
        base_url=srv.base_url,
        concurrency=1,
        max_cost_usd=0.01,
        price_input_per_mtok=2.5,
        price_output_per_mtok=10.0,
    )
    out = run_judge(OpenAIJudge(cfg), [synthetic(2, i) for i in range(20)], n=20, seed=0)
    s = out.summary
    assert s["budget_exhausted"] and s["n_skipped"] > 0 and s["n"] > 0
    assert s["n"] + s["n_skipped"] == 20 and s["cost_usd"] <= 0.01
    assert len(srv.completion_requests) == s["n"]


def test_configuration_errors_are_raised_before_any_request(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(JudgeError, match=KEY_ENV):
        OpenAIJudge(judge_config(backend="openai"))
    with pytest.raises(JudgeError, match="price"):
        OpenAIJudge(
            judge_config(
                backend="openai",
                base_url="http://127.0.0.1:9/v1",
                model="my-local-model",
                max_cost_usd=1.0,
            )
        )
    with pytest.raises(JudgeError, match="replayable"):
        make_judge(judge_config(backend="grounded"))
