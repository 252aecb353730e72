"""The OpenAI-compatible server refuses out-of-range decoding settings with a 400."""

from __future__ import annotations

import json

import httpx
import pytest

from components.lm.generate import Generator
from components.lm.server import CompletionServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def url(random_model, tokenizer):
    with CompletionServer({"m": Generator(random_model, tokenizer)}, port=0) as srv:
        yield srv.base_url


def post(url: str, body: dict) -> httpx.Response:
    # NaN and Infinity as Python's json writes them (httpx's json= refuses them)
    return httpx.post(f"{url}/completions", content=json.dumps(body), timeout=30)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"temperature": float("nan")}, "must be finite"),
        ({"temperature": float("inf")}, "must be finite"),
        ({"top_p": float("nan")}, "must be finite"),
        ({"seed": 2**70}, "seed: expected an integer in [0, 2**63)"),
        ({"seed": 2**63}, "seed: expected an integer in [0, 2**63)"),
        ({"seed": -1}, "seed: expected an integer in [0, 2**63)"),
        ({"max_tokens": 10**12}, "maximum context length is 2048 tokens"),
    ],
)
def test_out_of_range_settings_are_refused_in_one_line(url, fields, message) -> None:
    r = post(url, {"model": "m", "prompt": [5, 6, 7], "max_tokens": 4, **fields})
    error = r.json()["error"]["message"]
    assert r.status_code == 400 and message in error and "\n" not in error


def test_the_context_counts_the_prompt(url, random_model) -> None:
    limit = random_model.config.max_position_embeddings
    body = {"model": "m", "prompt": [5, 6, 7], "max_tokens": limit - 2}
    r = post(url, body)
    assert r.status_code == 400
    assert f"needs {limit + 1} (3 in the prompt, {limit - 2} in max_tokens)" in r.text
    ok = post(url, {**body, "max_tokens": 2, "seed": 2**63 - 1, "temperature": 1.0})
    assert ok.status_code == 200, ok.text
