"""components/pool.py: a pool stopped by an error leaves nothing running behind it."""

from __future__ import annotations

import time

import pytest

from components.pool import interruptible_pool, submit_all


@pytest.mark.integration
def test_a_pool_stopped_mid_job_has_no_thread_left_to_race_the_exit():
    with pytest.raises(KeyboardInterrupt), interruptible_pool(1) as pool:
        futures = submit_all(pool, time.sleep, [(60,)])
        while not pool._processes:  # the worker is spawned: its job is (about to be) on
            time.sleep(0.05)
        # what the pool forgets on shutdown
        manager, wakeup = pool._executor_manager_thread, pool._executor_manager_thread_wakeup
        workers = list(pool._processes.values())
        raise KeyboardInterrupt  # what Ctrl-C raises in the parent
    # the manager thread closed its wakeup pipe and ended: concurrent.futures' exit hook,
    # which writes to that pipe unlocked, finds it closed instead of racing its closing
    assert not manager.is_alive() and wakeup._closed
    assert not any(p.is_alive() for p in workers)
    assert futures[0].done()
