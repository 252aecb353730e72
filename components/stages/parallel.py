"""Run a stage's independent jobs (one per training seed, or per seed and mode) in parallel.

Training seeds are independent runs: a stage hands each to a spawned worker process (one
torch thread each: the policies are small and TextWorld steps in Python, so processes,
not threads, use the cores). Workers never talk to MLflow; they return plain results and
the stage process logs them. A worker that dies takes the stage down with a clear error;
a worker of a killed stage exits with it (no orphan keeps writing).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

R = TypeVar("R")
log = logging.getLogger("dreamgym")


def _init_worker(parent_pid: int) -> None:
    import torch

    from components.envs.textworld_tasks import exit_with_parent

    exit_with_parent(parent_pid)
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
    """
    if workers <= 1 or len(jobs) <= 1:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return [fn(*job) for job in jobs]
        finally:
            torch.set_num_threads(threads)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    n = min(workers, len(jobs))
    log.info("running %d jobs in %d worker processes", len(jobs), n)
    with ProcessPoolExecutor(
        n, mp_context=ctx, initializer=_init_worker, initargs=(os.getpid(),)
    ) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        return [f.result() for f in futures]
