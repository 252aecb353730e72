"""Spawned process pools that stop at once on Ctrl-C (SIGINT).

Only the parent handles SIGINT: its workers never act on it, from their first instruction
(the parent blocks SIGINT while it spawns them, and a process inherits its mask) to their
last (the pool initializer ignores it). A worker hit by the interrupt could otherwise die
in its start-up, or catch it in a job's import, keep the half-imported module and fail
every later job, or sit idle while the parent waits for it forever.

On an interrupt (or any other error) in the block of ``interruptible_pool`` the parent
cancels the work not started, terminates the workers and waits a few seconds at most for
them; it never waits for their jobs to finish. A worker's SIGTERM unwinds the job it
runs, so the job's ``finally`` blocks still close what it opened (a MiniWoB++ env's
chromedriver and Chromium, which ignore SIGINT like the worker that started them), then
the worker exits. ``Interrupted`` then ends the command with exit code 130 (128 + SIGINT,
what shells report for Ctrl-C) and no traceback.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

EXIT_INTERRUPTED = 130  # 128 + SIGINT
TERMINATE_WAIT_S = 3.0  # after SIGTERM, then SIGKILL


class Interrupted(SystemExit):
    """Ctrl-C ended the work: exit code 130, no traceback (the one line is printed first)."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_INTERRUPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


def interrupted(message: str) -> Interrupted:
    """Print ``interrupted: <message>`` (one line on stderr); the exception to raise."""
    import sys

    print(f"interrupted: {message}", file=sys.stderr, flush=True)
    return Interrupted(message)


def ignore_sigint() -> None:
    """In a worker: SIGINT is the parent's to handle (it terminates the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # if spawned with it blocked


class _Terminated(BaseException):
    """SIGTERM in a worker's job: unwinds it (not an ``Exception``: no job handler eats it)."""


# in a worker process: how many jobs are on its stack (a SIGTERM between jobs just exits)
_running_jobs = 0


def _on_sigterm(signum: int, frame: Any) -> None:
    if _running_jobs:
        # once: the pool sends another SIGTERM when a sibling worker exits, which would
        # cut this job's cleanup short (the parent's SIGKILL still bounds it)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated
    os._exit(128 + signum)


def _job(fn: Callable[..., Any], *args: Any) -> Any:
    """One job in a worker: a SIGTERM unwinds it (its cleanup runs), then the worker exits."""
    global _running_jobs
    _running_jobs += 1
    try:
        return fn(*args)
    except _Terminated:
        os._exit(128 + signal.SIGTERM)
    finally:
        _running_jobs -= 1


def init_worker(parent_pid: int) -> None:
    """Pool initializer: ignore SIGINT, unwind the job on SIGTERM; exit as soon as the
    parent dies (kill -9)."""
    from components.envs.textworld_tasks import exit_with_parent

    ignore_sigint()
    signal.signal(signal.SIGTERM, _on_sigterm)
    exit_with_parent(parent_pid)


@contextmanager
def _spawning() -> Iterator[None]:
    """Processes spawned in this block start with SIGINT blocked (a signal mask survives
    exec), so an interrupt during their start-up stays pending until ``ignore_sigint``
    discards it: it cannot kill them half-way. An interrupt meanwhile is kept and raised
    here as KeyboardInterrupt when the block ends, whichever thread the kernel gave it to
    (ignoring SIGINT instead, as before, lost it when another thread took it)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and only it gets KeyboardInterrupt)
        return
    caught: list[int] = []
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if old is None else old)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # a pending one is raised now
    if caught:
        raise KeyboardInterrupt


def submit_all(
    pool: ProcessPoolExecutor, fn: Callable[..., Any], jobs: Iterable[tuple[Any, ...]]
) -> list[Future[Any]]:
    """``[pool.submit(fn, *job) for job in jobs]``; the workers these start ignore SIGINT
    and, stopped, let the job clean up (``_job``)."""
    with _spawning():  # the pool spawns its workers as work is submitted
        return [pool.submit(_job, fn, *job) for job in jobs]


def stop_pool(pool: ProcessPoolExecutor, wait_s: float = TERMINATE_WAIT_S) -> None:
    """Cancel the pool's pending work and end its workers now (SIGTERM, then SIGKILL)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() forgets it
    for p in procs:
        if p.is_alive():
            p.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)
    # the pool's manager thread, seeing its workers gone, closes its wakeup pipe; CPython
    # 3.11 writes to that pipe at interpreter exit without a lock (concurrent.futures'
    # _python_exit), so a manager still running then races it and the interrupted
    # command ended with "Exception ignored ... OSError: [Errno 9] Bad file descriptor"
    if manager is not None:
        manager.join(wait_s)


@contextmanager
def interruptible_pool(
    workers: int,
    initializer: Callable[..., None] = init_worker,
    initargs: tuple[Any, ...] | None = None,
) -> Iterator[ProcessPoolExecutor]:
    """A spawn-context ``ProcessPoolExecutor`` of ``workers`` processes whose block waits
    for its jobs when it ends normally and stops them at once when it raises (Ctrl-C,
    an error, a generator closed early). ``initializer`` must call ``ignore_sigint``;
    it gets ``initargs``, by default the parent's pid (as ``init_worker`` wants)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    # spawn: no forked engine state; a dying worker raises BrokenProcessPool, never hangs
    with _spawning():  # in case this Python's pool spawns its workers at once
        pool = ProcessPoolExecutor(
            workers,
            mp_context=ctx,
            initializer=initializer,
            initargs=(os.getpid(),) if initargs is None else initargs,
        )
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
