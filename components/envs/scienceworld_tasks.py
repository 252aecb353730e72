"""Deterministic ScienceWorld task suite: variations per task type, split by variation.

ScienceWorld ships its own split of every task type's variations into train / dev / test
lists; we keep it (dev = our validation, test = held out), so no variation ever crosses
splits. For each task name, ``cfg.scienceworld.variations.<split>`` variations are drawn
from the matching list in a seeded order (``cfg.seed``). Every chosen variation is
verified: its gold path, replayed in the real engine, must complete the task (score 100);
one that does not is replaced by the next variation of the same list.

A Task: ``family`` = the task name, ``seed`` = the variation index, ``difficulty`` = the
gold path's length, ``walkthrough`` = the gold path, ``instruction`` = ScienceWorld's task
description. Written to ``out_dir/tasks.jsonl``.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

from components.config import Config
from components.envs.base import EnvError, write_task_suite
from components.envs.scienceworld_env import ScienceWorldEnv
from components.schema import Split, Task, stable_id

log = logging.getLogger(__name__)

ENV_NAME = "scienceworld"
SUITE_VERSION = "sw-suite-1"  # part of every task id: bump when the recipe changes
SPLITS: tuple[Split, ...] = ("train", "validation", "test")


def task_id(name: str, variation: int) -> str:
    """Stable id of one task variation."""
    return f"sw-{name}-{variation:04d}-{stable_id(ENV_NAME, name, variation, SUITE_VERSION, n=8)}"


def _verified_gold(
    env: ScienceWorldEnv, name: str, variation: int, max_steps: int
) -> list[str] | None:
    """The gold path if replaying it completes the variation within ``max_steps``."""
    probe = Task(
        task_id=task_id(name, variation),
        env=ENV_NAME,
        family=name,
        difficulty=0,
        split="train",
        instruction="probe",
        seed=variation,
    )
    env.reset(probe)
    gold = env.gold_path
    if not gold or len(gold) > max_steps:
        return None
    for i, action in enumerate(gold):
        _, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            # ScienceWorld's gold paths may run on after the task is complete
            return gold[: i + 1] if reward == 1 else None
    return None


def generate_task_suite(cfg: Config, out_dir: Path, progress: bool = True) -> list[Task]:
    """Choose and verify the variations of ``cfg.scienceworld``; write ``tasks.jsonl``."""
    from components.progress import progress_bar

    sw = cfg.env.scienceworld
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = ScienceWorldEnv(
        max_steps=cfg.env.max_steps,
        simplifications=sw.simplifications,
        max_admissible=sw.max_admissible,
    )
    tasks: list[Task] = []
    start = time.perf_counter()
    total = len(sw.task_names) * sum(getattr(sw.variations, s) for s in SPLITS)
    bar = progress_bar(total=total, desc="scienceworld tasks", unit="task", disable=not progress)
    try:
        for name in sw.task_names:
            for split in SPLITS:
                wanted = getattr(sw.variations, split)
                pool = env.variations(name, split)
                random.Random(stable_id("sw-split", cfg.seed, name, split)).shuffle(pool)
                found = 0
                for variation in pool:
                    if found == wanted:
                        break
                    try:
                        gold = _verified_gold(env, name, variation, cfg.env.max_steps)
                    except EnvError as err:
                        log.warning("%s variation %d failed: %s", name, variation, err)
                        gold = None
                    if gold is None:
                        log.info("skip %s variation %d: gold path does not win", name, variation)
                        continue
                    tasks.append(
                        Task(
                            task_id=task_id(name, variation),
                            env=ENV_NAME,
                            family=name,
                            difficulty=len(gold),
                            split=split,
                            instruction=env.task_description,
                            seed=variation,
                            walkthrough=gold,
                        )
                    )
                    found += 1
                    bar.update(1)
                if found < wanted:
                    # the whole list is used: short lists (power-component has 5 test
                    # variations) are expected, variations whose gold path fails are not
                    level = logging.WARNING if found < len(pool) else logging.INFO
                    log.log(
                        level,
                        "%s: %d of %d %s variations (its list has %d, %d win)",
                        name,
                        found,
                        wanted,
                        split,
                        len(pool),
                        found,
                    )
                    bar.total -= wanted - found
    finally:
        bar.close()
        env.close()
    write_task_suite(out_dir, tasks)
    log.info("scienceworld suite: %d tasks in %.1f s", len(tasks), time.perf_counter() - start)
    return tasks
