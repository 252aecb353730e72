"""A real OpenAI-compatible HTTP server for tests, with scheduled fault injection.

``FakeOpenAIServer`` binds 127.0.0.1 on a free port and serves ``POST
/v1/chat/completions`` (and ``GET /v1/models``) from a threaded stdlib server. Each
incoming completion request takes the next fault from a FIFO schedule (``ok`` once the
schedule is empty, or whatever ``fault_fn`` decides), so tests can script timeouts, 429s,
5xx, truncated or non-JSON bodies and malformed answers. Every request is recorded with
its headers (tests check that Authorization arrived); nothing is ever logged.

    with FakeOpenAIServer(faults=["429", "ok"], api_key="sk-test") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test")

Opt-in generation-server behaviour (off by default, so the teacher tests see no change):
``honor_stop=True`` cuts each answer at the request's earliest ``stop`` string as vLLM
does (the string is dropped unless ``include_stop_str_in_output``; ``finish_reason``
"stop" and vLLM's ``stop_reason`` name it); ``serve_completions=True`` also serves
``POST /v1/completions`` (raw ``prompt``, answers in ``choices[0].text``).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OK = "ok"
DELAY = "delay"  # answer only after delay_s (beyond the client's timeout)
RATE_LIMIT = "429"  # 429 with Retry-After: retry_after_s
SERVER_ERROR = "500"
UNAVAILABLE = "503"
TRUNCATED = "truncated"  # Content-Length promises more than is sent, then the socket closes
TRUNCATED_JSON = "truncated_json"  # complete HTTP body, but the JSON is cut in half
NON_JSON = "non_json"  # 200 with an HTML page (a proxy's error page)
MALFORMED = "malformed"  # valid completion whose answer has no <think>...</think>
LENGTH = "length"  # answer cut by max_tokens: finish_reason 'length', no closing tag
UNAUTHORIZED_ECHO = "401_echo"  # 401 whose body echoes the Authorization header back
BAD_REQUEST = "400"
DROP = "drop"  # the connection closes before any response byte (a proxy restart)
RATE_LIMIT_BARE = "429_bare"  # 429 without Retry-After: the client's own backoff applies
SLOW_BODY = "slow_body"  # headers and half the body, then a pause of delay_s (read timeout)
# the transient faults a client retries through (the teacher's first fault tests)
TRANSIENT = (
    DELAY,
    RATE_LIMIT,
    SERVER_ERROR,
    UNAVAILABLE,
    TRUNCATED,
    TRUNCATED_JSON,
    NON_JSON,
    MALFORMED,
    LENGTH,
)
FAULTS = (OK, *TRANSIENT, UNAUTHORIZED_ECHO, BAD_REQUEST, DROP, RATE_LIMIT_BARE, SLOW_BODY)

COMPLETIONS_PATH = "/v1/completions"
_ACTION_LINE = re.compile(r"^Action \(a_t\): (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any
    fault: str
    received_at: float


def default_answer(body: dict[str, Any]) -> str:
    """A valid teacher answer that echoes the transition's action (to check routing)."""
    messages = body.get("messages") or [{}]
    user = str(messages[-1].get("content", ""))
    m = _ACTION_LINE.search(user)
    action = m.group(1).strip() if m else "the action"
    return f"<think>Taking '{action}' here leads to the recorded next state.</think>"


_JUDGE_STEP = re.compile(r"^Step \d+$", re.MULTILINE)


def judge_answer(body: dict[str, Any]) -> str:
    """A valid judge verdict whose scores encode the number of steps shown (routing check).

    For n steps: consistency = n % 3, informativeness = (n + 1) % 3, diversity = 2,
    hallucination = 2. Pass as ``answer_fn`` to serve the judge's JSON verdicts.
    """
    messages = body.get("messages") or [{}]
    n = len(_JUDGE_STEP.findall(str(messages[-1].get("content", ""))))
    verdict = {
        "consistency": n % 3,
        "diversity": 2,
        "informativeness": (n + 1) % 3,
        "hallucination": 2,
        "rationale": f"{n} steps judged",
    }
    return json.dumps(verdict)


def count_tokens(text: str) -> int:
    """The fake tokenizer: whitespace-separated words."""
    return len(text.split())


@dataclass
class _State:
    faults: deque[str]
    fault_fn: Callable[[int, dict[str, Any]], str] | None
    api_key: str | None
    delay_s: float
    retry_after_s: float
    answer_fn: Callable[[dict[str, Any]], str]
    honor_stop: bool = False
    serve_completions: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    requests: list[RecordedRequest] = field(default_factory=list)
    served: list[dict[str, Any]] = field(default_factory=list)
    n_completions: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler stuck in a DELAY must not hang shutdown
    state: _State


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log (it must never show headers)."""

    def _send(
        self,
        code: int,
        payload: bytes,
        ctype: str = "application/json",
        *,
        upto: int | None = None,
        **hdrs: str,
    ) -> None:
        """Send ``payload`` (only its first ``upto`` bytes, if given: Content-Length still
        promises the whole)."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in hdrs.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(payload[:upto])
        self.wfile.flush()

    def _json(self, code: int, obj: Any, **hdrs: str) -> None:
        self._send(code, json.dumps(obj).encode(), **hdrs)

    def do_GET(self) -> None:
        self._record(None, "ok")
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found", "type": "not_found"}})

    def _record(self, body: Any, fault: str) -> None:
        st = self.server.state
        rec = RecordedRequest(
            self.command,
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            fault,
            time.monotonic(),
        )
        with st.lock:
            st.requests.append(rec)

    def do_POST(self) -> None:
        st = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        served = {"/v1/chat/completions"} | ({COMPLETIONS_PATH} if st.serve_completions else set())
        if self.path.rstrip("/") not in served or not isinstance(body, dict):
            self._record(body, "bad_path")
            self._json(404, {"error": {"message": "not found", "type": "not_found"}})
            return
        with st.lock:
            index = st.n_completions
            st.n_completions += 1
            if st.faults:
                fault = st.faults.popleft()
            elif st.fault_fn is not None:
                fault = st.fault_fn(index, body)
            else:
                fault = OK
        self._record(body, fault)
        auth = self.headers.get("Authorization", "")
        if fault == UNAUTHORIZED_ECHO:
            # A misbehaving proxy that reflects the credentials back in its error body.
            msg = f"invalid credentials: {auth}"
            self._json(401, {"error": {"message": msg, "type": "invalid_request_error"}})
            return
        if st.api_key is not None and auth != f"Bearer {st.api_key}":
            self._json(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
            return
        # A client that gave up (timeout) has nobody left to answer to.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._dispatch(fault, body)

    def _dispatch(self, fault: str, body: dict[str, Any]) -> None:
        st = self.server.state
        err = {"error": {"message": f"injected {fault}", "type": "server_error"}}
        if fault == RATE_LIMIT:
            self._json(429, err, Retry_After=f"{st.retry_after_s:g}")
        elif fault in (SERVER_ERROR, UNAVAILABLE):
            self._json(int(fault), err)
        elif fault == BAD_REQUEST:
            self._json(400, {"error": {"message": "context too long", "type": "invalid"}})
        elif fault == NON_JSON:
            self._send(200, b"<html><body>502 Bad Gateway</body></html>", ctype="text/html")
        elif fault == DELAY:
            if st.stop.wait(st.delay_s):
                return
            self._json(200, self._completion(body, st.answer_fn(body), fault))
        elif fault == TRUNCATED:
            payload = json.dumps(self._completion(body, st.answer_fn(body), fault)).encode()
            self._send(200, payload, upto=len(payload) // 2)
            self.close_connection = True
        elif fault == TRUNCATED_JSON:
            payload = json.dumps(self._completion(body, st.answer_fn(body), fault)).encode()
            self._send(200, payload[: len(payload) // 2])
        elif fault == DROP:
            self.close_connection = True  # nothing written: the client sees a dead socket
        elif fault == RATE_LIMIT_BARE:
            self._json(429, err)
        elif fault == SLOW_BODY:
            payload = json.dumps(self._completion(body, st.answer_fn(body), fault)).encode()
            self._send(200, payload, upto=len(payload) // 2)
            if st.stop.wait(st.delay_s):
                return
            self.wfile.write(payload[len(payload) // 2 :])
            self.wfile.flush()
        elif fault == MALFORMED:
            answer = "The action leads to the next state because it is valid."
            self._json(200, self._completion(body, answer, fault))
        elif fault == LENGTH:
            answer = st.answer_fn(body)
            cut = answer[: max(1, len(answer) // 2)]
            self._json(200, self._completion(body, cut, fault, "length"))
        else:
            self._json(200, self._completion(body, st.answer_fn(body), fault))

    def _completion(
        self, body: dict[str, Any], answer: str, fault: str, finish_reason: str = "stop"
    ) -> dict[str, Any]:
        """A chat completion, or a text one on ``/v1/completions``; usage counted, served."""
        st = self.server.state
        stop_reason = None
        if st.honor_stop:
            answer, finish_reason, stop_reason = _apply_stop(body, answer, finish_reason)
        text = self.path.rstrip("/") == COMPLETIONS_PATH
        choice: dict[str, Any] = {"index": 0}
        if text:
            prompt = str(body.get("prompt", ""))
            choice |= {"text": answer, "finish_reason": finish_reason, "stop_reason": stop_reason}
        else:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
            choice["message"] = {"role": "assistant", "content": answer}
            choice["finish_reason"] = finish_reason
            if st.honor_stop:
                choice["stop_reason"] = stop_reason  # vLLM names the stop string that matched
        usage = {"prompt_tokens": count_tokens(prompt), "completion_tokens": count_tokens(answer)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        with st.lock:
            st.served.append({"fault": fault, **usage})
        return {
            "id": f"{'cmpl' if text else 'chatcmpl'}-fake-{len(st.served)}",
            "object": "text_completion" if text else "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
            "choices": [choice],
            "usage": usage,
        }


def _apply_stop(body: dict[str, Any], answer: str, finish_reason: str) -> tuple[str, str, Any]:
    """(answer cut at the earliest requested stop string, finish_reason, stop_reason)."""
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    hits = [(answer.index(s), s) for s in stop if s in answer]
    if not hits:
        return answer, finish_reason, None
    at, s = min(hits)
    keep = at + len(s) if body.get("include_stop_str_in_output") else at
    return answer[:keep], "stop", s


class FakeOpenAIServer:
    """Context manager running the fake server in a background thread."""

    def __init__(
        self,
        faults: Iterable[str] = (),
        *,
        api_key: str | None = None,
        delay_s: float = 2.0,
        retry_after_s: float = 0.2,
        fault_fn: Callable[[int, dict[str, Any]], str] | None = None,
        answer_fn: Callable[[dict[str, Any]], str] = default_answer,
        honor_stop: bool = False,
        serve_completions: bool = False,
    ) -> None:
        faults = list(faults)
        unknown = sorted(set(faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {FAULTS}")
        self._state = _State(
            deque(faults),
            fault_fn,
            api_key,
            delay_s,
            retry_after_s,
            answer_fn,
            honor_stop=honor_stop,
            serve_completions=serve_completions,
        )
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeOpenAIServer:
        """Bind a free port on 127.0.0.1 and serve in a daemon thread."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.state = self._state
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port (pending delayed answers are dropped)."""
        self._state.stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port."""
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (ends with /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def push_faults(self, *faults: str) -> None:
        """Append faults to the schedule (consumed one per completion request)."""
        with self._state.lock:
            self._state.faults.extend(faults)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far (a copy)."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def completion_requests(self) -> list[RecordedRequest]:
        """Only the chat-completion requests."""
        return [r for r in self.requests if r.path.rstrip("/") == "/v1/chat/completions"]

    @property
    def served_usage(self) -> list[dict[str, Any]]:
        """Usage (+ 'fault') of every completion body produced, also the cut/delayed ones."""
        with self._state.lock:
            return list(self._state.served)
