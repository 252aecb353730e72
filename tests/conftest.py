"""Shared fixtures: offline/quiet environment and a session-wide Prefect test server."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from components.cpu_kernels import pin_cpu_kernels
from tests.fakes.openai_server import FakeOpenAIServer

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # a loaded 2-core machine starts the ephemeral server of a flow subprocess in > 20 s
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)
pin_cpu_kernels()  # as the stages run: the same floats on every AVX2 CI host


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest files first: the e2e pipeline, then files with `slow` tests.

    `make test` hands whole files to two xdist workers in this order
    (--dist loadfile --no-loadscope-reorder): the e2e file (~10 min) starts at once on one
    worker while the other takes the slow files, and the short files fill in at the end,
    so both workers finish together.
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("e2e"):
            return 0
        return 1 if item.path in slow_files else 2

    items.sort(key=rank)  # stable: collection order within each rank


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One torch thread in every test: on the contended 2-core machine two threads are many
    times slower, and a file's thread count no longer depends on what ran before it on its
    xdist worker (a subfolder's session fixture set it for every later file)."""
    from components.lm.decoding import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def prefect_harness():
    """A throwaway Prefect server for flow tests (started once, ~15 s; 90+ s under load)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):  # a loaded 2-core machine is slow
        yield


@pytest.fixture
def fake_openai() -> Iterator[Callable[..., FakeOpenAIServer]]:
    """Factory of started fake OpenAI-compatible servers (127.0.0.1); all stopped at teardown."""
    servers: list[FakeOpenAIServer] = []

    def start(**kwargs: Any) -> FakeOpenAIServer:
        srv = FakeOpenAIServer(**kwargs).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture(autouse=True)
def _sigint_state_restored() -> Iterator[None]:
    """Each test starts with the SIGINT handler and mask the previous one found.

    A test (or a library it calls) that leaves SIGINT ignored or blocked in the worker
    passes that on to every child a later test starts (both survive exec): the Ctrl-C
    tests' children then never saw the test's SIGINT (three CI failures on one worker).
    The state is put back and the leak named in the warnings summary.
    """
    import signal
    import threading
    import warnings

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    yield
    after_handler = signal.getsignal(signal.SIGINT)
    after_mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    if after_handler is not handler or after_mask != mask:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        warnings.warn(
            f"the test left SIGINT changed (handler {after_handler!r}, mask "
            f"{sorted(after_mask)}); restored",
            stacklevel=1,
        )
