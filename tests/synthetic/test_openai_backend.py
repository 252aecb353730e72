"""The synthetic env over an OpenAI-compatible server (the local fake vLLM)."""

from __future__ import annotations

from components.config import SyntheticEnvConfig
from components.experience.dataset import PromptSettings
from components.experience.synthetic_env import MALFORMED, VectorSyntheticEnv, generate_fns
from components.lm.openai_backend import OpenAIBackend, OpenAIBackendConfig
from tests.fakes.openai_server import SERVER_ERROR, FakeOpenAIServer
from tests.synthetic.conftest import answer_for

CFG = SyntheticEnvConfig(max_steps=3, max_new_tokens=64)
NO_REPLAY = PromptSettings(history_len=2, k=0, with_reasoning=True)


def _echo_action(body):
    # a "world model" server that moves the agent into a room named after its action
    action = body["messages"][-1]["content"].rsplit("Action: ", 1)[1].strip()
    return answer_for(f"Location: {action}", reward=int(action == "win"))


def _backend(url: str, key_env: str = "SYNTH_TEST_KEY") -> OpenAIBackend:
    return OpenAIBackend(
        OpenAIBackendConfig(
            model="fake-model",
            base_url=url,
            api_key_env=key_env,
            max_retries=0,
            on_failure="empty",
        )
    )


def test_steps_go_through_the_server_and_failures_become_malformed(index, tasks, monkeypatch):
    monkeypatch.setenv("SYNTH_TEST_KEY", "sk-test")
    with FakeOpenAIServer(api_key="sk-test", answer_fn=_echo_action) as srv:
        generate, resample = generate_fns(_backend(srv.base_url), CFG)
        venv = VectorSyntheticEnv(generate, index, cfg=CFG, prompt=NO_REPLAY, resample=resample)
        venv.reset(tasks)
        outs = venv.step(["north", "win"])
        assert [o.observation for o in outs] == ["Location: north", "Location: win"]
        assert [o.terminated for o in outs] == [False, True]
        bodies = [r.body for r in srv.requests if r.method == "POST"]
        assert {b["max_tokens"] for b in bodies} == {64} and bodies[0]["stop"] == ["</reward>"]
    # a server that keeps failing: the answer is empty, resampled once, then the episode fails
    monkeypatch.delenv("SYNTH_TEST_KEY")
    with FakeOpenAIServer(fault_fn=lambda i, body: SERVER_ERROR) as srv:
        generate, resample = generate_fns(_backend(srv.base_url), CFG)
        venv = VectorSyntheticEnv(generate, index, cfg=CFG, prompt=NO_REPLAY, resample=resample)
        venv.reset([tasks[0]])
        out = venv.step(["north"])[0]
        assert out.terminated and out.info[MALFORMED] and out.reward == 0
        assert venv.metrics()["n_failed_malformed"] == 1
        assert len([r for r in srv.requests if r.method == "POST"]) == 2
