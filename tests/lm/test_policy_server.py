"""The LM policy served over the OpenAI protocol answers exactly as it does in process.

A tiny policy is saved as ``models/policy/sft/seed-0`` and served by the project's own
server (components/lm/server.py, the ``dreamgym serve`` command) on 127.0.0.1; the policy
loaded with ``serving.policy_backend: openai`` decodes there through ``OpenAIBackend``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from components.agent.loading import Acting, load_policy
from components.agent.policy import Observation, PolicySettings, render_answer
from components.agent.policy_model import PolicyModel
from components.config import ServingConfig, load_config
from components.lm.server import CompletionServer

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
URL_ENV = "DREAMGYM_TEST_POLICY_URL"
KEY_ENV = "DREAMGYM_TEST_POLICY_KEY"
NAME = "models/policy/sft/seed-0"
ADMISSIBLE = ("go east", "take key", "open chest", "look")
OBSERVATIONS = [
    Observation("Open the chest.", "Location: Hall\nInventory: nothing", (), ADMISSIBLE),
    Observation("Take the key.", "Location: Vault\nA key on the floor.", (), ADMISSIBLE[:2]),
    Observation("Look around the vault and then open the chest.", "Location: Vault", (), ()),
    Observation("Go east.", "Location: Hall", (("look", "Location: Hall"),), ADMISSIBLE[::-1]),
]
ACTIONS = ("open chest", "take key", "look", "go east")  # what the policy learns to answer


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project root holding, at ``NAME``, a tiny policy (no reasoning) warm-started to
    answer observation i with ``<action>ACTIONS[i]</action>`` (a random one only repeats
    newlines: greedy equality would prove little)."""
    import torch

    from components.lm.decoding import torch_threads

    root = tmp_path_factory.mktemp("project")
    texts = [
        f"<action>{a}</action> {o.instruction} {o.state}" for o in OBSERVATIONS for a in ADMISSIBLE
    ]
    torch.manual_seed(0)
    policy = PolicyModel.tiny(
        texts * 10, preset="nano", vocab_size=400, settings=PolicySettings(with_reasoning=False)
    )
    prompts = policy.prompt_ids(OBSERVATIONS)
    answers = [
        policy.tokenizer(render_answer(a, None), add_special_tokens=False)["input_ids"]
        for a in ACTIONS
    ]
    opt = torch.optim.Adam(policy.model.parameters(), lr=3e-3)
    with torch_threads(1):
        for _ in range(40):
            loss = -policy.sequence_logprobs(prompts, answers).logprobs.sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    policy.model.eval()
    policy.save(root / NAME)
    return root


@pytest.fixture(scope="module")
def server(project: Path):
    with CompletionServer({NAME: project / NAME}, port=0) as srv:
        yield srv


def served(**overrides) -> ServingConfig:
    return ServingConfig(
        policy_backend="openai", base_url_env=URL_ENV, api_key_env=KEY_ENV, **overrides
    )


@pytest.fixture
def served_policy(project: Path, server: CompletionServer, monkeypatch) -> PolicyModel:
    monkeypatch.setenv(URL_ENV, server.base_url)
    monkeypatch.delenv(KEY_ENV, raising=False)
    return load_policy(project / NAME, serving=served(max_retries=0), root=project)


def test_greedy_actions_via_the_server_equal_the_local_ones(project, served_policy):
    local = load_policy(project / NAME)  # serving.policy_backend local: the default
    assert local.backend is None and served_policy.backend is not None
    assert served_policy.backend.cfg.model == NAME  # the directory relative to the root
    mine = local.act(OBSERVATIONS, temperature=0.0, max_new_tokens=24)
    theirs = served_policy.act(OBSERVATIONS, temperature=0.0, max_new_tokens=24)
    assert [a.action for a in mine] == list(ACTIONS)  # well-formed, different answers
    for a, b in zip(mine, theirs, strict=True):
        assert (b.action, b.text, b.error) == (a.action, a.text, a.error)
        assert (b.prompt_ids, b.completion_ids) == (a.prompt_ids, a.completion_ids)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)  # scored here, same weights
    # one at a time (batched differently on the server): the same answers
    alone = [served_policy.act([o], temperature=0.0, max_new_tokens=24)[0] for o in OBSERVATIONS]
    assert [a.completion_ids for a in alone] == [a.completion_ids for a in mine]
    # evaluation's actor reads no log-probs: none are scored for a served policy
    acts = Acting(served_policy, 0.0, 24).act(OBSERVATIONS)
    assert [a.action for a in acts] == [a.action for a in mine]
    assert all(a.logprobs == () for a in acts)


def test_a_server_without_token_ids_gives_the_same_actions(project, served_policy):
    """vLLM before ``return_token_ids``: the answer text is re-encoded here."""
    local = load_policy(project / NAME)
    backend = served_policy.backend
    served_policy.backend = type(backend)(
        backend.cfg.model_copy(update={"return_token_ids": False})
    )
    mine = local.act(OBSERVATIONS, temperature=0.0, max_new_tokens=24)
    theirs = served_policy.act(OBSERVATIONS, temperature=0.0, max_new_tokens=24)
    assert [(b.action, b.text) for b in theirs] == [(a.action, a.text) for a in mine]


def test_sampling_on_the_server_follows_torchs_seed(served_policy):
    import torch

    def sample(seed: int) -> list[str]:
        torch.manual_seed(seed)  # evaluation seeds every pass like this
        return [a.text for a in served_policy.act(OBSERVATIONS * 2, temperature=1.0)]

    assert sample(7) == sample(7)
    assert any(sample(s) != sample(7) for s in (8, 9))


def test_training_never_decodes_on_the_server(project, served_policy, monkeypatch):
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:9/v1")
    policy = load_policy(project / NAME, trainable=True, serving=served(), root=project)
    assert policy.backend is None  # its weights change every round: a server would lag
    for profile in ("ci", "cpu", "gpu"):
        assert load_config(ROOT / "params.yaml", profile).serving.policy_backend == "local"


def test_the_server_speaks_the_protocol_and_refuses_in_one_line(server: CompletionServer):
    url = server.base_url
    assert httpx.get(f"{url}/models").json()["data"][0]["id"] == NAME
    body = {"model": NAME, "prompt": "<action>", "max_tokens": 8, "temperature": 0}
    text = httpx.post(f"{url}/completions", json=body).json()["choices"][0]["text"]
    chat = {"model": NAME, "messages": [{"role": "user", "content": "Take the key."}]}
    reply = httpx.post(f"{url}/chat/completions", json={**chat, "max_tokens": 8}).json()
    assert isinstance(text, str) and reply["choices"][0]["message"]["role"] == "assistant"
    refusals = [
        ({**body, "model": "nope"}, 404, "'nope' is not served"),
        ({**body, "n": 2}, 400, "only n = 1"),
        ({**body, "max_tokens": "many"}, 400, "max_tokens: expected int"),
        ({**body, "prompt": 3}, 400, "prompt: expected"),
        ({**body, "stop": [""]}, 400, "stop: expected"),
        ({**body, "prompt": [1, 10**6]}, 400, "token ids in [0, "),  # no IndexError (500)
        ({**body, "prompt": [True, 2]}, 400, "token ids in [0, "),
        ({**chat, "messages": [{"role": "user", "content": None}]}, 400, "chat template"),
    ]
    for request, status, message in refusals:
        path = "chat/completions" if "messages" in request else "completions"
        r = httpx.post(f"{url}/{path}", json=request)
        error = r.json()["error"]["message"]
        assert r.status_code == status and message in error and "\n" not in error
    r = httpx.post(f"{url}/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["message"] == "body is not JSON"
    # read(-1) waited for the client to close (clients refuse to send it: a raw socket)
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(
            f"POST {where.path}/completions HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: -1\r\n\r\n{}".encode()
        )
        assert sock.recv(64).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert httpx.post(f"{url}/embeddings", json=body).status_code == 404


@pytest.mark.integration
def test_dreamgym_serve_command_serves_a_saved_policy(project: Path):
    import socket

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    env = {**os.environ, "DREAMGYM_TEST_SERVE_KEY": "sk-local"}
    base = [sys.executable, "-m", "components.cli", "serve", "--model", NAME]
    headers = {"Authorization": "Bearer sk-local"}
    # the free port is only free until the server binds it (after importing torch): if
    # another process took it meanwhile, the server exits and the next try picks another
    for _ in range(3):
        cmd = [*base, "--port", str(free_port()), "--api-key-env", "DREAMGYM_TEST_SERVE_KEY"]
        proc = subprocess.Popen(cmd, cwd=project, env={**env, "PYTHONPATH": str(ROOT)})
        url = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}/v1"
        deadline = time.monotonic() + 90
        models = None
        while proc.poll() is None and models is None:
            try:
                models = httpx.get(f"{url}/models", headers=headers)
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise AssertionError("server never came up") from None
                time.sleep(0.5)
        if models is not None:
            break
    else:
        raise AssertionError("the server exited on three ports in a row")
    try:
        assert [m["id"] for m in models.json()["data"]] == [NAME]
        assert httpx.get(f"{url}/models").status_code == 401  # the key is required
        body = {"model": NAME, "prompt": "<action>", "max_tokens": 4, "return_token_ids": True}
        choice = httpx.post(f"{url}/completions", json=body, headers=headers).json()["choices"][0]
        assert 1 <= len(choice["token_ids"]) <= 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    busy = subprocess.run(
        [*cmd[:5], "missing/dir"], cwd=project, capture_output=True, text=True, env=env
    )
    assert busy.returncode == 1 and busy.stderr.startswith("error: --model missing/dir")


def test_a_request_that_breaks_decoding_fails_alone_not_its_batch():
    from types import SimpleNamespace

    from components.lm.server import Batcher, _Job

    class Generator:  # fails any batch holding token id 13, as a bad id would
        def complete_ids(self, prompts, **settings):
            if any(13 in p for p in prompts):
                raise IndexError("index out of range in self")
            return [SimpleNamespace(text=f"ok {p[0]}") for p in prompts]

    batcher = Batcher({"m": Generator()}, max_batch=8, wait_s=0.5)
    try:
        settings = (8, 0.0, 1.0, (), None)
        jobs = batcher.run([_Job("m", [p], settings) for p in (1, 13, 2)])  # one batch
    finally:
        batcher.close()
    assert [j.result.text if j.result else None for j in jobs] == ["ok 1", None, "ok 2"]
    assert jobs[1].error == "generation failed: IndexError: index out of range in self"
