"""A local fake of AgentGym's WebShop / ALFWorld / WebArena env servers, over real HTTP.

It speaks the same requests and answers as the real servers (see
components/envs/agentgym_http.py) with tiny deterministic worlds behind them, and can
inject faults per path: an HTTP status (500, 503) or a delay longer than the client's
timeout, each for the next ``n`` requests. Counters record every request and every step
the server really applied, so tests can check that nothing was applied twice.

    with serve("alfworld") as server:
        server.inject("/step", status=500)      # the next /step answers 500
        server.inject("/observation", delay=1)  # the next GET /observation stalls 1 s
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

COLORS = ("red", "blue", "green", "black")
OBJECTS = ("mug", "apple", "book", "pen")


@dataclass
class Fault:
    """The next ``n`` requests to a path fail this way."""

    status: int | None = None
    delay: float = 0.0
    n: int = 1


# -- the three tiny worlds -------------------------------------------------------------------


class WebShopWorld:
    """Search -> results -> product -> choose the color -> buy now (reward 1 if right)."""

    def __init__(self) -> None:
        self.session = 0
        self.page = "search"
        self.color: str | None = None

    def goal_color(self) -> str:
        return COLORS[self.session % len(COLORS)]

    def instruction(self) -> str:
        return f"Instruction: Find me a {self.goal_color()} mug, and price lower than 20.00 dollars"

    def reset(self, session: int) -> None:
        self.session, self.page, self.color = session, "search", None

    def observation(self) -> str:
        head = f"WebShop [SEP] {self.instruction()} [SEP] "
        if self.page == "search":
            return head + "Search"
        if self.page == "results":
            return head + "Back to Search [SEP] Page 1 [SEP] B0001 [SEP] Mug [SEP] $9.00"
        return (
            head
            + f"Back to Search [SEP] Mug [SEP] color [SEP] {' [SEP] '.join(COLORS)} [SEP] Buy Now"
        )

    def available(self) -> dict[str, Any]:
        if self.page == "search":
            return {"has_search_bar": True, "clickables": ["search"]}
        if self.page == "results":
            return {"has_search_bar": False, "clickables": ["back to search", "b0001"]}
        return {"has_search_bar": False, "clickables": ["back to search", *COLORS, "buy now"]}

    def step(self, action: str) -> tuple[str, float, bool]:
        m = re.match(r"^(search|click)\[(.+)\]$", action)
        clickables = self.available()["clickables"]
        if m is None or (m.group(1) == "click" and m.group(2) not in clickables):
            return self.observation(), 0.0, False  # WebShop performs nothing
        verb, arg = m.groups()
        if verb == "search" and self.page == "search":
            self.page = "results"
        elif arg == "back to search":
            self.page = "search"
        elif arg == "b0001":
            self.page = "item"
        elif arg in COLORS:
            self.color = arg
        elif arg == "buy now":
            reward = 1.0 if self.color == self.goal_color() else 0.5
            return "Thank you for shopping with us!", reward, True
        return self.observation(), 0.0, False


class AlfWorldWorld:
    """Go to the table, take the object, go to the cabinet, put it there."""

    def __init__(self) -> None:
        self.game = 0
        self.at = "middle"
        self.holding = False

    def obj(self) -> str:
        return OBJECTS[self.game % len(OBJECTS)]

    def reset(self, game: int) -> str:
        self.game, self.at, self.holding = game, "middle", False
        return (
            "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking "
            "quickly around you, you see a cabinet 1 and a table 1.\n\n"
            f"Your task is to: put a {self.obj()} in cabinet 1."
        )

    def available(self) -> list[str]:
        actions = ["go to cabinet 1", "go to table 1", "inventory", "look"]
        if self.at == "table 1" and not self.holding:
            actions.append(f"take {self.obj()} 1 from table 1")
        if self.at == "cabinet 1" and self.holding:
            actions.append(f"put {self.obj()} 1 in/on cabinet 1")
        return sorted(actions)

    def step(self, action: str) -> tuple[str, float, bool]:
        if action not in self.available():
            return "Nothing happens.", 0.0, False
        if action.startswith("go to "):
            self.at = action[len("go to ") :]
            return f"You arrive at {self.at}.", 0.0, False
        if action.startswith("take "):
            self.holding = True
            return f"You pick up the {self.obj()} 1 from the table 1.", 0.0, False
        if action.startswith("put "):
            return f"You put the {self.obj()} 1 in/on the cabinet 1.", 1.0, True
        return f"You are at {self.at}.", 0.0, False


class WebArenaWorld:
    """Answer with ``stop [<the number on the page>]``; ``cut_after`` steps without one,
    the server truncates the episode (its own step limit)."""

    cut_after: int | None = None

    def __init__(self) -> None:
        self.idx = 0
        self.previous = "None"
        self.steps = 0
        self.truncated = False

    def answer(self) -> str:
        return str(40 + self.idx)

    def prompt(self) -> str:
        return (
            f"OBSERVATION:\n[1] RootWebArea 'Shop admin' focused: True\n[7] link 'Orders'\n"
            f"[9] StaticText 'Orders today: {self.answer()}'\nURL: http://shop.local/admin\n"
            f"OBJECTIVE: How many orders were placed today?\nPREVIOUS ACTION: {self.previous}"
        )

    def reset(self, idx: int) -> str:
        self.idx, self.previous, self.steps, self.truncated = idx, "None", 0, False
        return self.prompt()

    def step(self, llm_text: str) -> tuple[str, float, bool]:
        self.steps += 1
        self.truncated = self.cut_after is not None and self.steps >= self.cut_after
        m = re.search(r"```((.|\n)*?)```", llm_text)
        if m is None:
            return "Cannot parse action from response", 0.0, False
        action = m.group(1).strip()
        self.previous = action
        stop = re.match(r"^stop \[(.*)\]$", action)
        if stop:
            return self.prompt(), 1.0 if stop.group(1) == self.answer() else 0.0, True
        return self.prompt(), 0.0, False


# -- the server --------------------------------------------------------------------------------


@dataclass
class FakeServer:
    """State shared by the request handlers: worlds, faults, counters."""

    kind: str
    url: str = ""
    worlds: dict[int, Any] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    applied_steps: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def inject(self, path: str, status: int | None = None, delay: float = 0.0, n: int = 1) -> None:
        """The next ``n`` requests to ``path`` answer ``status`` / stall ``delay`` seconds."""
        self.faults[path] = Fault(status=status, delay=delay, n=n)

    def new_world(self) -> int:
        """Create a remote env; its id."""
        world = {"webshop": WebShopWorld, "alfworld": AlfWorldWorld, "webarena": WebArenaWorld}[
            self.kind
        ]()
        idx = len(self.worlds)
        self.worlds[idx] = world
        return idx


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    id_key = "id" if server.kind == "alfworld" else "env_idx"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # the client may have given up already (timeout)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        def _fault(self, path: str) -> tuple[int | None, float]:
            with server.lock:
                server.requests[f"{self.command} {path}"] += 1
                fault = server.faults.get(path)
                if fault is None or fault.n <= 0:
                    return None, 0.0
                fault.n -= 1
                return fault.status, fault.delay

        def _dispatch(self, body: dict[str, Any], query: dict[str, Any]) -> None:
            path = urlparse(self.path).path
            status, delay = self._fault(path)
            if status is not None:
                self._send(status, {"detail": "injected"})
                return
            answer = self._answer(path, body, query)  # applied even when the answer stalls
            if delay:
                time.sleep(delay)
            self._send(200, answer)

        def _answer(self, path: str, body: dict[str, Any], query: dict[str, Any]) -> Any:
            kind = server.kind
            if path == "/create":
                idx = server.new_world()
                return (
                    idx if kind == "webshop" else {"id" if kind == "alfworld" else "env_idx": idx}
                )
            raw = body.get(id_key, query.get(id_key))
            world = server.worlds.get(int(raw)) if raw is not None else None
            if world is None:
                return {"error": f"The id {raw} is not valid."}
            if path == "/reset":
                if kind == "webshop":
                    world.reset(int(body["session_id"]))
                    return [world.observation(), None]
                if kind == "alfworld":
                    if int(body["game"]) >= 1000:
                        return {"error": "game index out of range"}
                    obs = world.reset(int(body["game"]))
                    return {
                        "id": raw,
                        "observation": obs,
                        "available_actions": world.available(),
                        "task_type": "pick_and_place_simple",
                    }
                return {"observation": world.reset(int(body["idx"]))}
            if path == "/step":
                with server.lock:
                    server.applied_steps += 1
                obs, reward, done = world.step(str(body["action"]))
                if kind == "webshop":
                    return {"state": obs, "reward": reward, "done": done, "info": None}
                if kind == "alfworld":
                    return {
                        "observation": obs,
                        "reward": reward,
                        "done": done,
                        "available_actions": [] if done else world.available(),
                    }
                return {
                    "observation": obs,
                    "reward": reward,
                    "terminated": done,
                    "truncated": not done and world.truncated,
                    "info": None,
                }
            if path == "/observation":
                if kind == "webshop":
                    return world.observation()
                return world.prompt() if kind == "webarena" else "You are here."
            if path == "/available_actions":
                return world.available()
            if path == "/instruction_text":
                return world.instruction()
            if path == "/close":
                return {"closed": True}
            return {"error": f"unknown path {path}"}

        def do_GET(self) -> None:
            query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            self._dispatch({}, query)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            self._dispatch(body if isinstance(body, dict) else {}, {})

    return Handler


@contextmanager
def serve(kind: str) -> Iterator[FakeServer]:
    """Run a fake ``kind`` server (webshop / alfworld / webarena) on 127.0.0.1."""
    state = FakeServer(kind=kind)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, name=f"fake-{kind}", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
