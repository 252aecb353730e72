"""The ``serving`` section picks the experience model's backend: local dir or a served model."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import ConfigError, ServingConfig, load_config
from components.lm.generate import Generator
from components.lm.openai_backend import GenerationError, OpenAIBackend
from components.lm.serving import experience_backend, local_model_dir
from tests.fakes import openai_server as fk

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
URL_ENV = "DREAMGYM_TEST_SERVING_URL"
KEY_ENV = "DREAMGYM_TEST_SERVING_KEY"
ANSWER = "<state>the door is open</state><reward>1</reward> trailing words"


def served(**overrides) -> ServingConfig:
    """A serving section for the fake server (test-sized retries)."""
    return ServingConfig(
        backend="openai",
        experience_model="dreamgym-experience",
        base_url_env=URL_ENV,
        api_key_env=KEY_ENV,
        **overrides,
    )


def test_local_backend_loads_the_model_dir_relative_to_the_root(chain_model, tokenizer, tmp_path):
    model_dir = tmp_path / "models" / "experience" / "full"
    chain_model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    serving = ServingConfig(experience_model="models/experience/full")
    assert local_model_dir(serving, tmp_path) == model_dir

    backend = experience_backend(serving, tmp_path)
    assert isinstance(backend, Generator)
    # the saved chain model answers exactly like the in-memory one
    out = backend.generate(["some words <state>"], max_new_tokens=20, stop=("</reward>",))
    assert out == ["x</state><reward>0</reward>"]
    with pytest.raises(FileNotFoundError, match="train it first"):
        experience_backend(ServingConfig(experience_model="models/missing"), tmp_path)


def test_openai_backend_sends_the_served_name_and_cuts_at_the_stop(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)  # a local vLLM takes any key
    with fk.FakeOpenAIServer(answer_fn=lambda body: ANSWER, honor_stop=True) as srv:
        monkeypatch.setenv(URL_ENV, srv.base_url)
        backend = experience_backend(served(), Path("/nonexistent"))  # root is not read
        assert isinstance(backend, OpenAIBackend)
        out = backend.generate([[{"role": "user", "content": "go"}]], stop=("</reward>",))
        assert out == ["<state>the door is open</state><reward>1</reward>"]
        sent = srv.completion_requests[-1]
        assert sent.body["model"] == "dreamgym-experience"
        assert sent.headers["authorization"] == "Bearer EMPTY"


def test_a_failing_server_gives_empty_answers_not_an_exception(monkeypatch):
    # every request fails for good: the synthetic env will count a malformed answer
    with fk.FakeOpenAIServer(fault_fn=lambda i, body: fk.SERVER_ERROR) as srv:
        monkeypatch.setenv(URL_ENV, srv.base_url)
        backend = experience_backend(served(max_retries=0), Path("."))
        (c,) = backend.complete([[{"role": "user", "content": "go"}]], stop=("</reward>",))
        assert (c.text, c.finish_reason) == ("", "error")
        assert len(srv.completion_requests) == 1


def test_openai_backend_without_a_url_or_key_names_the_variables(monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(GenerationError, match=f"{URL_ENV}.*{KEY_ENV}"):
        experience_backend(served(), Path("."))


def test_params_yaml_has_a_valid_serving_section_in_every_profile(tmp_path):
    for profile in ("ci", "cpu", "gpu"):
        serving = load_config(ROOT / "params.yaml", profile).serving
        assert serving.backend == "local"  # nothing is served or downloaded by default
        assert serving.base_url_env == "DREAMGYM_OPENAI_BASE_URL"
    text = (ROOT / "params.yaml").read_text().replace("backend: local", "backend: vllm", 1)
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"serving\.backend"):
        load_config(tmp_path / "params.yaml")
