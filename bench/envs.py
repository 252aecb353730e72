"""Real-env throughput per env: TextWorld, ScienceWorld (JVM), MiniWoB++ (headless Chromium).

For each env: engine start-up, a small task suite (timed apart), then single-process
stepping with the collection policies (expert, random) for at least ``MIN_SECONDS`` each,
counting resets inside the loop as part of the cost (an episode's real price); the
engine's cold start (JVM, browser) is measured apart. Writes
bench/results/envs.json with the machine's load average, since the 2 cores are shared.
An env whose system dependency is missing (Java, Chromium) is reported as skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results")
MIN_SECONDS = 8.0


def _stepping(env: Any, tasks: list[Any], policy_name: str) -> dict[str, Any]:
    """Play episodes round-robin over ``tasks`` for MIN_SECONDS; steps/s incl. resets."""
    from components.data.policies import make_policy

    steps = episodes = wins = 0
    reset_s = 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < MIN_SECONDS:
        task = tasks[episodes % len(tasks)]
        policy = make_policy(policy_name, seed=episodes, epsilon=0.3, p_invalid=0.05)
        t0 = time.perf_counter()
        _, info = env.reset(task)
        reset_s += time.perf_counter() - t0
        done = False
        while not done:
            _, reward, terminated, truncated, info = env.step(policy.act(info, env))
            steps += 1
            done = terminated or truncated
        episodes += 1
        wins += int(reward == 1)
    seconds = time.perf_counter() - start
    return {
        "steps": steps,
        "episodes": episodes,
        "seconds": round(seconds, 2),
        "steps_per_s": round(steps / seconds, 1),
        "mean_reset_s": round(reset_s / episodes, 3),
        "success_rate": round(wins / episodes, 3),
    }


def _measure(name: str, make: Callable[[Path], tuple[Any, list[Any], float]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        start = time.perf_counter()
        env, tasks, suite_s = make(Path(tmp))
        try:
            env.reset(tasks[0])  # warm: the engine's cold start is measured apart
            expert = _stepping(env, tasks, "expert")
            rand = _stepping(env, tasks, "random")
        finally:
            env.close()
        total = time.perf_counter() - start
    steps = expert["steps"] + rand["steps"]
    seconds = expert["seconds"] + rand["seconds"]
    return {
        "steps_per_s": round(steps / seconds, 1),
        "expert": expert,
        "random": rand,
        "suite_seconds": round(suite_s, 1),
        "n_tasks": len(tasks),
        "wall_seconds": round(total, 1),
    }


def textworld_suite(tmp: Path) -> tuple[list[Any], float]:
    """A small TextWorld suite (quests and treasure hunts) generated under ``tmp`` (timed)."""
    from components.config.small import small_config
    from components.envs.textworld_tasks import generate_task_suite

    cfg = small_config(
        [("quest", 2, 2, 4), ("treasure", 1, 5, 5)],
        profile="cpu",
        seed=5,
        max_steps=30,
        split=(0.6, 0.1),
    )
    t0 = time.perf_counter()
    tasks = generate_task_suite(cfg, tmp / "data" / "tasks", progress=False, root=tmp)
    return tasks, time.perf_counter() - t0


def _textworld(tmp: Path) -> tuple[Any, list[Any], float]:
    from components.envs.textworld_engines import EnginePool
    from components.envs.textworld_env import TextWorldEnv

    tasks, suite_s = textworld_suite(tmp)
    # engines only: every step runs the game (a kept answer tree would make replayed
    # steps free; bench.answer_tree measures that side by side)
    engines = EnginePool(max_idle=0, max_answers=0)
    return TextWorldEnv(max_steps=30, root=tmp, engines=engines), tasks, suite_s


_ONE_TRAIN_ONE_TEST = {"train": 1, "validation": 0, "test": 1}  # instances per task name


def _suite(
    env_cfg: Any, generate: Callable[..., list[Any]], tmp: Path
) -> tuple[Any, list[Any], float]:
    """An env of ``env_cfg`` and its task suite, generated into ``tmp`` (timed)."""
    from components.config.small import small_config
    from components.envs import make_env

    cfg = small_config([("quest", 2, 1, 3)], profile="cpu", env=env_cfg)
    t0 = time.perf_counter()
    tasks = generate(cfg, tmp, progress=False)
    suite_s = time.perf_counter() - t0
    return make_env(cfg.env), tasks, suite_s


def _scienceworld(tmp: Path) -> tuple[Any, list[Any], float]:
    from components.config import EnvConfig, ScienceWorldConfig
    from components.envs.scienceworld_tasks import generate_task_suite

    sw = ScienceWorldConfig(
        task_names=("find-animal", "power-component", "lifespan-longest-lived"),
        variations=_ONE_TRAIN_ONE_TEST,
    )
    env_cfg = EnvConfig(name="scienceworld", max_steps=30, scienceworld=sw)
    return _suite(env_cfg, generate_task_suite, tmp)


def _miniwob(tmp: Path) -> tuple[Any, list[Any], float]:
    from components.config import EnvConfig, MiniWoBConfig
    from components.envs.miniwob_tasks import generate_task_suite

    mw = MiniWoBConfig(
        task_names=("login-user", "click-checkboxes", "search-engine", "navigate-tree"),
        seeds=_ONE_TRAIN_ONE_TEST,
    )
    env_cfg = EnvConfig(name="miniwob", max_steps=12, miniwob=mw)
    return _suite(env_cfg, generate_task_suite, tmp)


def _engine_start(name: str) -> float:
    """Seconds to start one engine and reset one task (JVM / browser cold start)."""
    from components.envs.miniwob_env import MiniWoBEnv
    from components.envs.scienceworld_env import ScienceWorldEnv
    from components.schema import Task

    task = Task(
        task_id="t",
        env=name,
        family="find-animal" if name == "scienceworld" else "login-user",
        difficulty=0,
        split="train",
        instruction="x",
        seed=1,
    )
    env: Any = ScienceWorldEnv(max_steps=5) if name == "scienceworld" else MiniWoBEnv(max_steps=5)
    t0 = time.perf_counter()
    try:
        env.reset(task)
        return round(time.perf_counter() - t0, 2)
    finally:
        env.close()


def main() -> dict[str, Any]:
    """Run the benchmark; writes bench/results/envs.json."""
    from components.envs.miniwob_env import DEFAULT_CHROME, DEFAULT_CHROMEDRIVER

    available = {
        "textworld": True,
        "scienceworld": shutil.which("java") is not None,
        "miniwob": Path(DEFAULT_CHROME).exists() and Path(DEFAULT_CHROMEDRIVER).exists(),
    }
    makers = {"textworld": _textworld, "scienceworld": _scienceworld, "miniwob": _miniwob}
    result: dict[str, Any] = {"load_avg_before": list(os.getloadavg())}
    for name, make in makers.items():
        if not available[name]:
            result[name] = {"skipped": "system dependency missing (make system-deps)"}
            continue
        result[name] = _measure(name, make)
        if name != "textworld":
            result[name]["cold_start_and_reset_s"] = _engine_start(name)
        print(name, json.dumps(result[name]), flush=True)
    result["load_avg_after"] = list(os.getloadavg())
    result["device"] = f"cpu ({os.cpu_count()} cores, shared with other jobs)"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "envs.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    bench_parser("bench.envs", __doc__).parse_args()
    main()
