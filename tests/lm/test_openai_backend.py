"""The OpenAI-compatible generation backend against a real local HTTP server."""

from __future__ import annotations

import json
import logging
import random

import pytest

from components.lm.generate import GenerationBackend
from components.lm.openai_backend import GenerationError, OpenAIBackend, OpenAIBackendConfig
from tests.fakes import openai_server as fk

pytestmark = pytest.mark.timeout(60)
KEY = "sk-test-generation-0123456789"
KEY_ENV = "DREAMGYM_TEST_GEN_KEY"
URL_ENV = "DREAMGYM_TEST_GEN_URL"
ANSWER = "<think>it opens</think><state>the door is open</state><reward>0</reward> junk"
CUT = "<think>it opens</think><state>the door is open</state><reward>0</reward>"


def echo(body):
    """The answer names its prompt, so order can be checked."""
    if "prompt" in body:
        return f"<reward>{body['prompt']}</reward> more"
    return f"<reward>{body['messages'][-1]['content']}</reward> more"


def backend(srv, monkeypatch, **overrides) -> OpenAIBackend:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(URL_ENV, srv.base_url)
    settings = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0, **overrides}
    cfg = OpenAIBackendConfig(
        model="experience", base_url_env=URL_ENV, api_key_env=KEY_ENV, **settings
    )
    return OpenAIBackend(cfg, rng=random.Random(0))


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]


def test_is_a_generation_backend_and_never_shows_the_key(monkeypatch):
    with fk.FakeOpenAIServer(api_key=KEY) as srv:
        be = backend(srv, monkeypatch)
        assert isinstance(be, GenerationBackend)
        assert KEY not in repr(be)
        assert be.generate([chat("a")], stop=()) == [fk.default_answer({})]
        assert srv.requests[-1].headers["authorization"] == f"Bearer {KEY}"


def test_order_is_preserved_under_concurrency(monkeypatch):
    # every third request answers late: completions arrive out of order
    slow = lambda i, body: fk.DELAY if i % 3 == 0 else fk.OK  # noqa: E731
    with fk.FakeOpenAIServer(answer_fn=echo, fault_fn=slow, delay_s=0.3) as srv:
        be = backend(srv, monkeypatch, concurrency=8)
        prompts = [chat(f"p{i}") for i in range(12)]
        out = be.generate(prompts, stop=("</reward>",))
        assert out == [f"<reward>p{i}</reward>" for i in range(12)]
        assert len(srv.completion_requests) == 12


def test_stop_string_is_kept_when_the_server_honours_stop(monkeypatch):
    with fk.FakeOpenAIServer(answer_fn=lambda b: ANSWER, honor_stop=True) as srv:
        be = backend(srv, monkeypatch)
        (c,) = be.complete([chat("x")], stop=("</reward>",))
        assert (c.text, c.finish_reason) == (CUT, "stop")
        sent = srv.completion_requests[-1].body
        assert sent["stop"] == ["</reward>"] and sent["include_stop_str_in_output"] is True
        # an OpenAI-style server drops the stop string; vLLM's stop_reason puts it back
        plain = backend(srv, monkeypatch, vllm_extensions=False)
        assert plain.generate([chat("x")], stop=("</reward>",)) == [CUT]
        assert "include_stop_str_in_output" not in srv.completion_requests[-1].body


def test_a_server_that_ignores_stop_is_cut_on_the_client(monkeypatch):
    with fk.FakeOpenAIServer(answer_fn=lambda b: ANSWER) as srv:
        be = backend(srv, monkeypatch)
        assert be.generate([chat("x")], stop=("</reward>",)) == [CUT]
        (c,) = be.complete([chat("x")], stop=("</nothing>",))
        assert (c.text, c.finish_reason) == (ANSWER, "eos")


def test_transient_failures_are_retried(monkeypatch):
    faults = [fk.RATE_LIMIT, fk.SERVER_ERROR, fk.UNAVAILABLE, fk.TRUNCATED_JSON, fk.NON_JSON]
    with fk.FakeOpenAIServer(faults=faults, answer_fn=echo, retry_after_s=0.05) as srv:
        be = backend(srv, monkeypatch, concurrency=1, max_retries=5)
        assert be.generate([chat("a")], stop=("</reward>",)) == ["<reward>a</reward>"]
        assert [r.fault for r in srv.completion_requests] == [*faults, fk.OK]


def test_timeouts_are_retried(monkeypatch):
    with fk.FakeOpenAIServer(faults=[fk.DELAY], delay_s=3.0, answer_fn=echo) as srv:
        be = backend(srv, monkeypatch, timeout_s=1.0, max_retries=2)  # 0.3 s flaked under load
        assert be.generate([chat("a")], stop=("</reward>",)) == ["<reward>a</reward>"]
        assert len(srv.completion_requests) == 2


def test_exhausted_retries_raise_or_give_an_empty_answer(monkeypatch, caplog):
    with fk.FakeOpenAIServer(fault_fn=lambda i, b: fk.SERVER_ERROR) as srv:
        with pytest.raises(GenerationError, match="HTTP 500"):
            backend(srv, monkeypatch, max_retries=2).generate([chat("a")])
        assert len(srv.completion_requests) == 3
        soft = backend(srv, monkeypatch, max_retries=1, on_failure="empty")
        with caplog.at_level(logging.WARNING):
            (c,) = soft.complete([chat("a"), chat("b")][:1])
        assert (c.text, c.finish_reason) == ("", "error")
        assert KEY not in caplog.text


def test_a_bad_request_is_not_retried(monkeypatch):
    with fk.FakeOpenAIServer(faults=[fk.BAD_REQUEST]) as srv:
        with pytest.raises(GenerationError, match="HTTP 400"):
            backend(srv, monkeypatch).generate([chat("a")])
        assert len(srv.completion_requests) == 1


def test_refused_credentials_stop_everything_and_stay_secret(monkeypatch, caplog):
    with fk.FakeOpenAIServer(fault_fn=lambda i, b: fk.UNAUTHORIZED_ECHO) as srv:
        be = backend(srv, monkeypatch, concurrency=2)
        with caplog.at_level(logging.WARNING), pytest.raises(GenerationError) as err:
            be.generate([chat(str(i)) for i in range(20)])
        assert "401" in str(err.value) and KEY not in str(err.value)
        assert KEY not in caplog.text
        assert len(srv.completion_requests) < 20  # the others never went out


def test_raw_prompts_use_the_completions_endpoint(monkeypatch):
    with fk.FakeOpenAIServer(answer_fn=echo, serve_completions=True, honor_stop=True) as srv:
        be = backend(srv, monkeypatch)
        out = be.generate(["raw one", "raw two"], stop=("</reward>",))
        assert out == ["<reward>raw one</reward>", "<reward>raw two</reward>"]
        assert {r.path for r in srv.completion_requests} == set()  # not chat
        posted = [r for r in srv.requests if r.path == fk.COMPLETIONS_PATH]
        assert len(posted) == 2


def test_sampling_parameters_and_per_prompt_seeds(monkeypatch):
    with fk.FakeOpenAIServer(answer_fn=echo) as srv:
        be = backend(srv, monkeypatch)
        be.generate([chat("a")] * 3, max_new_tokens=17, temperature=0.7, top_p=0.9, seed=5)
        bodies = sorted(
            (r.body for r in srv.completion_requests), key=lambda b: json.dumps(b["seed"])
        )
        assert [b["seed"] for b in bodies] == [5, 6, 7]  # n rollouts of one task differ
        assert {(b["max_tokens"], b["temperature"], b["top_p"]) for b in bodies} == {(17, 0.7, 0.9)}


def test_a_missing_server_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(URL_ENV, raising=False)
    cfg = OpenAIBackendConfig(model="m", base_url_env=URL_ENV, api_key_env=KEY_ENV)
    with pytest.raises(GenerationError, match=URL_ENV):
        OpenAIBackend(cfg)
