"""Run a stage's independent jobs (one per training seed, or per seed and mode) in parallel.

Training seeds are independent runs: a stage hands each to a spawned worker process (one
torch thread each: the policies are small and TextWorld steps in Python, so processes,
not threads, use the cores). Workers never talk to MLflow; they return plain results and
the stage process logs them. A worker that dies takes the stage down with a clear error;
a worker of a killed stage exits with it (no orphan keeps writing). Ctrl-C is the stage
process's alone (components/pool.py): the workers ignore SIGINT, the stage terminates them
at once and exits with code 130 after one ``interrupted: ...`` line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

R = TypeVar("R")
log = logging.getLogger("dreamgym")


def _init_worker(parent_pid: int) -> None:
    from components.pool import init_worker

    init_worker(parent_pid)  # first: SIGINT ignored while torch imports
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def run_jobs(fn: Callable[..., R], jobs: Sequence[tuple[Any, ...]], workers: int) -> list[R]:
    """``[fn(*job) for job in jobs]``, in ``workers`` spawned processes (in order).

    ``fn`` must be a module-level function and the job arguments picklable. With one
    worker (or one job) everything runs in this process, which tests and debuggers like.
    Ctrl-C stops the workers at once and raises ``components.pool.Interrupted`` (exit 130).
    """
    from components.pool import interrupted, interruptible_pool, submit_all

    if workers <= 1 or len(jobs) <= 1:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        results: list[R] = []
        try:
            for job in jobs:
                results.append(fn(*job))
            return results
        except KeyboardInterrupt:
            raise interrupted(f"{len(results)} of {len(jobs)} jobs finished") from None
        finally:
            torch.set_num_threads(threads)
    n = min(workers, len(jobs))
    log.info("running %d jobs in %d worker processes", len(jobs), n)
    futures = []
    try:
        # spawned workers that ignore SIGINT; an interrupt (or a failed job) cancels the
        # jobs not started and terminates the workers at once
        with interruptible_pool(n, initializer=_init_worker) as pool:
            futures = submit_all(pool, fn, jobs)
            return [f.result() for f in futures]
    except KeyboardInterrupt:
        done = sum(f.done() and not f.cancelled() and f.exception() is None for f in futures)
        raise interrupted(f"{done} of {len(jobs)} jobs finished") from None
