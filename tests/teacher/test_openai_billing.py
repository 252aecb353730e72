"""Every billed 200 counts against the teacher's budget, also one that is no usable answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from components.teacher import iter_requests
from components.teacher.openai_teacher import OpenAITeacher
from tests.fakes.openai_server import default_answer
from tests.teacher.conftest import make_trajectories, openai_teacher_config

pytestmark = pytest.mark.timeout(60)
PRICED = {"price_input_per_mtok": 2.5, "price_output_per_mtok": 10.0}


def refusal(usage: dict[str, int]) -> dict[str, Any]:
    """A chat completion whose message is a refusal: content null."""
    message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}


def answer(body: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    """A valid teacher answer."""
    message = {"role": "assistant", "content": default_answer(body)}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}


class Scripted:
    """A local server answering each request with the next scripted body (the last repeats)."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.bodies = script, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Quiet."""

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                make = outer.script[min(len(outer.bodies), len(outer.script)) - 1]
                payload = json.dumps(make(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def scripted(api_key) -> Iterator[Any]:
    servers: list[Scripted] = []

    def start(*script: Any) -> Scripted:
        servers.append(Scripted(list(script)))
        return servers[-1]

    yield start
    for s in servers:
        s.server.shutdown()
        s.server.server_close()


def test_a_refusal_is_billed_and_resampled_at_once(scripted) -> None:
    srv = scripted(
        lambda b: refusal({"prompt_tokens": 1000, "completion_tokens": 10}),
        lambda b: answer(b, {"prompt_tokens": 1000, "completion_tokens": 20}),
    )
    # a transport retry would back off 5 s or more: a refusal is re-sampled at once
    cfg = openai_teacher_config(
        srv.base_url, backoff_base_s=10.0, backoff_max_s=10.0, max_cost_usd=1.0, **PRICED
    )
    teacher = OpenAITeacher(cfg)
    waits: list[float | None] = []
    retry_wait = teacher._backoff.retry_wait

    def recorded(*args, **kwargs):
        waits.append(retry_wait(*args, **kwargs))
        return waits[-1]

    teacher._backoff.retry_wait = recorded  # what it waited, not how long the host took
    [ann] = teacher.annotate(list(iter_requests(make_trajectories(1, 1), history_len=2)))
    teacher.close()
    assert waits == [0.0]
    assert ann.ok and ann.attempts == 2, ann.error
    assert [b["temperature"] for b in srv.bodies] == [0.0, 0.7]
    assert (ann.prompt_tokens, ann.completion_tokens) == (2000, 30)
    assert ann.cost_usd == pytest.approx((2000 * 2.5 + 30 * 10.0) / 1e6)
    assert teacher.spent_usd == pytest.approx(ann.cost_usd)


def test_every_billed_200_counts_even_when_the_item_fails(scripted) -> None:
    srv = scripted(
        lambda b: {"choices": [], "usage": {"prompt_tokens": 500, "completion_tokens": 0}},
        lambda b: refusal({"prompt_tokens": 1000, "completion_tokens": 10}),
    )
    cfg = openai_teacher_config(srv.base_url, max_retries=3, max_cost_usd=1.0, **PRICED)
    teacher = OpenAITeacher(cfg)
    [ann] = teacher.annotate(list(iter_requests(make_trajectories(1, 1), history_len=2)))
    teacher.close()
    assert ann.status == "failed" and ann.attempts == 4 == len(srv.bodies)
    assert ann.error.startswith("malformed answer: completion has no text content")
    assert "can't help" in ann.error and ann.raw == "I can't help with that."
    assert (ann.prompt_tokens, ann.completion_tokens) == (500 + 3 * 1000, 3 * 10)
    expected = ((500 + 3000) * 2.5 + 30 * 10.0) / 1e6
    assert ann.cost_usd == pytest.approx(expected)
    assert teacher.spent_usd == pytest.approx(expected)
