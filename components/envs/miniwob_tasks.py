"""Deterministic MiniWoB++ task suite: episode seeds per task, split by seed range.

For each task name in ``cfg.env.miniwob.task_names`` and each split, ``seeds.<split>``
episode seeds are drawn from a range of its own (train, validation and test seeds never
overlap), as a pure function of ``cfg.seed``. Every (task, seed) is opened once in the real
browser to read its instruction (MiniWoB generates it from the seed) and, where the task
has a scripted expert, the expert is played to record its winning walkthrough; a seed the
expert cannot win is kept (policies without an expert act randomly there) but logged.

A Task: ``family`` = the MiniWoB task name, ``seed`` = the episode seed, ``instruction`` =
MiniWoB's utterance, ``walkthrough`` = the expert's winning actions (None if it has none),
``difficulty`` = the walkthrough's length (0 if none). Written to ``out_dir/tasks.jsonl``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from components.config import Config
from components.envs.base import EnvError, write_task_suite
from components.envs.miniwob_env import EXPERTS, MiniWoBEnv
from components.schema import Split, Task, stable_id

log = logging.getLogger(__name__)

ENV_NAME = "miniwob"
SUITE_VERSION = "mw-suite-1"  # part of every task id: bump when the recipe changes
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
SEED_RANGE = 1_000_000  # split k draws its seeds from [k * SEED_RANGE, (k + 1) * SEED_RANGE)


def episode_seed(base_seed: int, task_name: str, split: Split, index: int) -> int:
    """The seed of the ``index``-th episode of a task in a split (ranges never overlap)."""
    offset = SPLITS.index(split) * SEED_RANGE
    return offset + int(stable_id("mw-seed", base_seed, task_name, index), 16) % SEED_RANGE


def task_id(task_name: str, split: Split, seed: int) -> str:
    """Stable id of one (task, seed)."""
    key = stable_id(ENV_NAME, task_name, seed, SUITE_VERSION, n=8)
    return f"mw-{task_name}-{split}-{seed}-{key}"


def expert_walkthrough(env: MiniWoBEnv, task: Task) -> list[str] | None:
    """The expert's actions if it wins ``task`` within the env's step limit, else None."""
    if task.family not in EXPERTS:
        return None
    env.reset(task)
    played: list[str] = []
    while True:
        action = env.expert_action()
        if action is None:
            return None
        played.append(action)
        _, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return played if reward == 1 else None


def generate_task_suite(cfg: Config, out_dir: Path, progress: bool = True) -> list[Task]:
    """Open every planned (task, seed) in Chromium; write ``out_dir/tasks.jsonl``."""
    from components.progress import progress_bar

    mw = cfg.env.miniwob
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = MiniWoBEnv.from_config(cfg.env)
    tasks: list[Task] = []
    start = time.perf_counter()
    plan = [
        (name, split, i)
        for name in mw.task_names
        for split in SPLITS
        for i in range(getattr(mw.seeds, split))
    ]
    try:
        for name, split, i in progress_bar(
            plan, desc="miniwob tasks", unit="task", disable=not progress
        ):
            seed = episode_seed(cfg.seed, name, split, i)
            probe = Task(
                task_id=task_id(name, split, seed),
                env=ENV_NAME,
                family=name,
                difficulty=0,
                split=split,
                instruction="probe",
                seed=seed,
            )
            try:
                env.reset(probe)
                utterance = env.utterance
                walkthrough = expert_walkthrough(env, probe)
            except EnvError as err:  # one retry on a fresh browser
                log.warning("browser error on %s seed %d, retrying: %s", name, seed, err)
                env.reset(probe)
                utterance = env.utterance
                walkthrough = expert_walkthrough(env, probe)
            if walkthrough is None and name in EXPERTS:
                log.warning("the %s expert does not win seed %d", name, seed)
            tasks.append(
                probe.model_copy(
                    update={
                        "instruction": utterance,
                        "walkthrough": walkthrough,
                        "difficulty": len(walkthrough or []),
                    }
                )
            )
    finally:
        env.close()
    write_task_suite(out_dir, tasks)
    log.info("miniwob suite: %d tasks in %.1f s", len(tasks), time.perf_counter() - start)
    return tasks
