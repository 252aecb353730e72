"""A small OpenAI-compatible server over the project's own batched ``Generator``.

``dreamgym serve --model models/policy/sft/seed-0 --port 8000`` serves saved causal-LM
directories (policies, the experience model) on 127.0.0.1, each under the path it was
given (``NAME=DIR`` names it), so ``serving.policy_backend: openai`` or
``serving.backend: openai`` can be tested end to end on one machine. On a GPU host,
``vllm serve <dir>`` is the drop-in: same protocol, same default model name.

Endpoints: ``GET /v1/models``; ``POST /v1/completions`` (``prompt``: a string, a list of
them, or token ids); ``POST /v1/chat/completions`` (``messages``, rendered with the model's
chat template). Decoding fields: ``max_tokens`` (16), ``temperature`` (1), ``top_p``,
``stop``, ``seed``; vLLM's extensions: ``include_stop_str_in_output``,
``add_special_tokens`` (completions: true, chat: false, as vLLM) and ``return_token_ids``
(``choices[i].token_ids``: the generated ids, through the stop or eos token). Choices carry
vLLM's ``stop_reason`` (the stop string matched, else null).

Requests run in one thread each (``ThreadingHTTPServer``); one decode thread batches the
requests that arrive together with the same model and decoding settings (a seeded request
decodes alone, so its seed means the same as in a call of its own). Errors are JSON
``{"error": {"message": ..., "type": ..., "code": ...}}`` with a one-line message: 400 bad
request, 401 wrong key, 404 unknown model or path, 500 failed generation.
"""

from __future__ import annotations

import glob
import itertools
import json
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger("dreamgym")

MAX_BODY_BYTES = 8 << 20


class RequestError(ValueError):
    """A request the server refuses: the HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def model_specs(specs: Sequence[str]) -> dict[str, Path]:
    """``--model`` values -> {served name: directory}: ``DIR`` (named as given, globs
    expanded) or ``NAME=DIR``. Raises ``FileNotFoundError`` naming a spec with no model."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        paths = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
        dirs = [p for p in paths if (Path(p) / "config.json").is_file()]
        if not dirs or (sep and len(dirs) > 1):
            raise FileNotFoundError(
                f"--model {spec}: no saved model there (a model directory has config.json)"
                if not dirs
                else f"--model {spec}: a NAME= takes one directory, the pattern matched {len(dirs)}"
            )
        for d in dirs:
            out[name or d.rstrip("/")] = Path(d)
    return out


@dataclass
class _Job:
    model: str
    encoded: list[int]
    settings: tuple[Any, ...]  # (max_new_tokens, temperature, top_p, stop, seed)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: str | None = None


class Batcher:
    """One decode thread: jobs that arrive within ``wait_s`` of each other and share a model
    and decoding settings decode as one batch of at most ``max_batch``."""

    def __init__(self, generators: dict[str, Any], max_batch: int, wait_s: float) -> None:
        self.generators, self.max_batch, self.wait_s = generators, max_batch, wait_s
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="decode", daemon=True)
        self._thread.start()

    def run(self, jobs: list[_Job]) -> list[_Job]:
        """Queue ``jobs`` and wait until every one is done."""
        for job in jobs:
            self._queue.put(job)
        for job in jobs:
            job.done.wait()
        return jobs

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            deadline = time.monotonic() + self.wait_s
            while len(jobs) < self.max_batch:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)  # stop after this batch
                    break
                jobs.append(job)
            groups: dict[tuple[Any, ...], list[_Job]] = {}
            for job in jobs:  # a seeded job decodes alone: its seed starts its own batch
                alone = (next(self._seq),) if job.settings[-1] is not None else ()
                groups.setdefault((job.model, job.settings, *alone), []).append(job)
            for group in groups.values():
                self._decode(group)

    def _decode(self, jobs: list[_Job]) -> None:
        max_new_tokens, temperature, top_p, stop, seed = jobs[0].settings
        try:
            done = self.generators[jobs[0].model].complete_ids(
                [j.encoded for j in jobs],
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                stop=stop,
                seed=seed,
                batch_size=self.max_batch,
            )
        except Exception as err:  # the requests fail (500), the server keeps serving
            if len(jobs) > 1:  # one bad request must not fail those batched with it
                log.warning("a batch of %d failed: decoding its requests one by one", len(jobs))
                for job in jobs:
                    self._decode([job])
                return
            log.exception("generation failed")
            jobs[0].error = f"generation failed: {type(err).__name__}: {err}".splitlines()[0]
        else:
            for job, completion in zip(jobs, done, strict=True):
                job.result = completion
        for job in jobs:
            job.done.set()


def _field(body: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RequestError(400, f"{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _settings(body: dict[str, Any]) -> tuple[Any, ...]:
    """The decoding settings of a request, validated (a bad field names itself)."""
    max_tokens = _field(body, "max_tokens", int, 16)
    temperature = _field(body, "temperature", float, 1.0)
    top_p = _field(body, "top_p", float, 1.0)
    seed = _field(body, "seed", int, None)
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop: expected a string or a list of non-empty strings")
    if not (math.isfinite(temperature) and math.isfinite(top_p)):
        raise RequestError(400, "temperature and top_p must be finite numbers")
    if max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise RequestError(400, "need max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")
    if seed is not None and not 0 <= seed < 2**63:  # torch seeds are 64-bit
        raise RequestError(400, f"seed: expected an integer in [0, 2**63), got {seed}")
    if _field(body, "n", int, 1) != 1 or body.get("stream"):
        raise RequestError(400, "only n = 1 without streaming is served")
    return (max_tokens, temperature, top_p, tuple(stop), seed)


def _check_context(generator: Any, encoded: list[list[int]], max_tokens: int) -> None:
    """``RequestError`` 400 when a prompt plus ``max_tokens`` exceeds the model's context."""
    limit = getattr(getattr(generator.model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int):  # no known limit: nothing to check
        return
    longest = max(map(len, encoded))
    if longest + max_tokens > limit:
        raise RequestError(
            400,
            f"this model's maximum context length is {limit} tokens; the request needs "
            f"{longest + max_tokens} ({longest} in the prompt, {max_tokens} in max_tokens)",
        )


class CompletionServer:
    """The HTTP server: ``start()`` in a thread (tests) or ``serve_forever()`` (the CLI)."""

    def __init__(
        self,
        models: dict[str, Any],
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        api_key: str | None = None,
        max_batch: int = 16,
        wait_s: float = 0.005,
    ) -> None:
        """``models``: served name -> a model directory or a ``Generator``."""
        from components.lm.generate import Generator
        from components.lm.models import load_pretrained_dir

        self.generators = {
            name: m if isinstance(m, Generator) else Generator(*load_pretrained_dir(Path(m)))
            for name, m in models.items()
        }
        self.api_key = api_key
        self._tokenize = threading.Lock()  # request threads share each model's tokenizer
        self.batcher = Batcher(self.generators, max_batch, wait_s)
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> CompletionServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever()
        finally:
            self.stop()

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread = None
        self.httpd.server_close()
        self.batcher.close()

    def __enter__(self) -> CompletionServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one request -------------------------------------------------------------------

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The JSON answer to a POST on ``path`` (``RequestError`` for a refusal)."""
        chat = path == "/v1/chat/completions"
        if not chat and path != "/v1/completions":
            raise RequestError(404, f"no endpoint {path}")
        name = body.get("model")
        if not isinstance(name, str) or name not in self.generators:
            raise RequestError(404, f"model {name!r} is not served; served: {sorted(self)}")
        generator = self.generators[name]
        settings = _settings(body)
        special = _field(body, "add_special_tokens", bool, not chat)
        with self._tokenize:
            encoded = [
                p
                if isinstance(p, list)
                else generator.tokenizer(p, add_special_tokens=special)["input_ids"]
                for p in self._prompts(generator, body, chat)
            ]
        if not all(encoded):
            raise RequestError(400, "prompt: empty")
        _check_context(generator, encoded, settings[0])
        jobs = self.batcher.run([_Job(name, e, settings) for e in encoded])
        failed = next((j.error for j in jobs if j.error), None)
        if failed:
            raise RequestError(500, failed)
        keep_stop = _field(body, "include_stop_str_in_output", bool, False)
        with_ids = _field(body, "return_token_ids", bool, False)
        choices = [
            self._choice(i, j.result, settings[3], chat, keep_stop, with_ids)
            for i, j in enumerate(jobs)
        ]
        n_prompt = sum(len(e) for e in encoded)
        n_out = sum(j.result.n_tokens for j in jobs)
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": name,
            "choices": choices,
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_out,
                "total_tokens": n_prompt + n_out,
            },
        }

    def __iter__(self):
        return iter(self.generators)

    @staticmethod
    def _prompts(generator: Any, body: dict[str, Any], chat: bool) -> list[str | list[int]]:
        if chat:
            messages = body.get("messages")
            ok = isinstance(messages, list) and messages
            if not ok or not all(isinstance(m, dict) and "content" in m for m in messages):
                raise RequestError(400, "messages: expected a non-empty list of messages")
            try:
                text = generator.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
            except Exception as err:  # no template, content the template cannot render
                raise RequestError(
                    400, f"messages: cannot apply the chat template ({type(err).__name__})"
                ) from None
            return [text]
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [prompt]
        vocab = len(generator.tokenizer)

        def ids(p: Any) -> bool:  # a non-empty list of this model's token ids
            return (
                isinstance(p, list)
                and bool(p)
                and all(type(t) is int and 0 <= t < vocab for t in p)  # not bool, in range
            )

        if ids(prompt):
            return [prompt]

        def one(p: Any) -> bool:  # a string or a non-empty list of token ids
            return isinstance(p, str) or ids(p)

        if isinstance(prompt, list) and prompt and all(one(p) for p in prompt):
            return list(prompt)
        raise RequestError(
            400, f"prompt: expected a string, a list of strings or token ids in [0, {vocab})"
        )

    @staticmethod
    def _choice(
        index: int, c: Any, stop: tuple[str, ...], chat: bool, keep_stop: bool, with_ids: bool
    ) -> dict[str, Any]:
        text = c.text
        matched = (
            next((s for s in stop if text.endswith(s)), None) if c.finish_reason == "stop" else None
        )
        if matched and not keep_stop:
            text = text[: -len(matched)]
        choice: dict[str, Any] = {"index": index}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        choice["finish_reason"] = "length" if c.finish_reason == "length" else "stop"
        choice["stop_reason"] = matched
        if with_ids:
            choice["token_ids"] = list(c.token_ids)
        return choice


def _handler(server: CompletionServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the OpenAI client reuses connections

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, payload: dict[str, Any], close: bool = False) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:  # after a refusal the connection may hold an unread body: start afresh
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def _error(self, err: RequestError) -> None:
            kind = "invalid_request_error" if err.status < 500 else "server_error"
            error = {"message": str(err), "type": kind, "code": err.status}
            self._send(err.status, {"error": error}, close=True)

        def _authorised(self) -> bool:
            if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                self._error(RequestError(401, "missing or wrong API key"))
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorised():
                return
            if self.path.rstrip("/") != "/v1/models":
                self._error(RequestError(404, f"no endpoint {self.path}"))
                return
            rows = [{"id": n, "object": "model", "owned_by": "dreamgym"} for n in server]
            self._send(200, {"object": "list", "data": rows})

        def do_POST(self) -> None:
            try:
                try:
                    size = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    raise RequestError(400, "bad Content-Length") from None
                if size < 0:  # read(-1) would wait for the client to close
                    raise RequestError(400, "bad Content-Length")
                if size > MAX_BODY_BYTES:
                    raise RequestError(400, f"body over {MAX_BODY_BYTES} bytes")
                raw = self.rfile.read(size)
                if not self._authorised():
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    raise RequestError(400, "body is not JSON") from None
                if not isinstance(body, dict):
                    raise RequestError(400, "body is not a JSON object")
                self._send(200, server.answer(self.path.rstrip("/"), body))
            except RequestError as err:
                self._error(err)
            except Exception as err:  # a bug: one line to the client, the traceback here
                log.exception("request failed")
                self._error(RequestError(500, f"{type(err).__name__}: {err}".splitlines()[0]))

    return Handler
