"""Which MiniWoB++ tasks the env can play: every task page the package ships, in Chromium.

``python -m bench.miniwob_coverage`` (also part of ``make bench``; skipped without
Chromium) opens each of the ``miniwob`` package's task pages (130) and plays a few
episodes with a random policy over the admissible commands, as the pipeline's random
baseline does, then writes bench/results/miniwob_coverage.json. Per task:

- ``expert``: the task has a scripted expert (``miniwob_experts.py``): only those are in
  ``env.miniwob.task_names``' default; any other task is collected by the random policies
  alone (``collect.policies``);
- ``episodes``, ``random_wins``: how often the random admissible policy won (up to
  ``BENCH_MW_STEPS`` steps); a task no episode won may still be winnable, a task won is
  playable from the admissible commands;
- ``elements``, ``admissible``: the mean number of elements a state lists and of commands
  offered; ``empty_states``: states (not last) that offered none: the page's controls are
  not read as elements (a canvas, a drag target, a widget the reader does not know);
- ``text_nodes``: elements with a negative id (MiniWoB's text nodes: they cannot be
  clicked, and no admissible command names one);
- ``invalid``: admissible commands the env then answered as invalid (0 unless the
  admissible list and the env disagree);
- ``error``: the page did not load or the browser failed.

The summary counts tasks by what the random policy found: ``won`` (playable as is),
``never_won`` and ``no_commands`` (every state empty: the task needs actions this env
does not have, such as drag or a canvas click).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from bench.common import bench_parser, cpu_name

RESULTS = Path("bench/results/miniwob_coverage.json")
SEED = 0
ENV = {
    "BENCH_MW_EPISODES": "random episodes per task (default 4)",
    "BENCH_MW_STEPS": "step limit of each episode (default 8)",
    "BENCH_MW_ELEMENTS": "elements a state lists (default 20, the env's; social-media needs 60)",
    "BENCH_MW_TASKS": "comma-separated task names (default: every page the package ships)",
}


def task_names() -> list[str]:
    """Every MiniWoB++ task page the installed ``miniwob`` package ships."""
    import miniwob

    pages = Path(miniwob.__file__).parent / "html" / "miniwob"
    return sorted(p.stem for p in pages.glob("*.html"))


def play_task(env: Any, name: str, episodes: int, rng: random.Random) -> dict[str, Any]:
    """Random admissible episodes on ``name``'s first test seeds: what the env offered."""
    from components.envs.base import ADMISSIBLE, VALID
    from components.envs.miniwob_env import EXPERTS
    from components.envs.miniwob_tasks import ENV_NAME, SEED_RANGE, task_id
    from components.schema import Task

    wins = states = empty = invalid = elements = offered = text_nodes = 0
    for i in range(episodes):
        seed = 2 * SEED_RANGE + i  # test-split seeds, as generate_task_suite numbers them
        task = Task(
            task_id=task_id(name, "test", seed),
            env=ENV_NAME,
            family=name,
            difficulty=0,
            split="test",
            instruction="probe",
            seed=seed,
        )
        _, info = env.reset(task)
        while True:
            commands = list(info[ADMISSIBLE] or [])
            states += 1
            elements += len(env.elements)
            offered += len(commands)
            text_nodes += sum(e.ref < 0 for e in env.elements)
            if not commands:
                empty += 1
                break
            _, reward, terminated, truncated, info = env.step(rng.choice(commands))
            invalid += not info[VALID]
            if terminated or truncated:
                wins += int(reward == 1)
                break
    return {
        "expert": name in EXPERTS,
        "episodes": episodes,
        "random_wins": wins,
        "elements": round(elements / states, 1),
        "admissible": round(offered / states, 1),
        "empty_states": empty,
        "text_nodes": text_nodes,
        "invalid": invalid,
    }


def main() -> dict[str, Any]:
    """Play every task; writes bench/results/miniwob_coverage.json."""
    from components.envs.base import EnvError
    from components.envs.miniwob_env import DEFAULT_CHROME, DEFAULT_CHROMEDRIVER, MiniWoBEnv
    from components.io import atomic_path
    from components.progress import progress_bar

    if not (Path(DEFAULT_CHROME).exists() and Path(DEFAULT_CHROMEDRIVER).exists()):
        print("bench.miniwob_coverage: no Chromium (make system-deps); results left alone")
        return {}
    episodes = int(os.environ.get("BENCH_MW_EPISODES", "4"))
    steps = int(os.environ.get("BENCH_MW_STEPS", "8"))
    elements = int(os.environ.get("BENCH_MW_ELEMENTS", "20"))
    names = [n for n in os.environ.get("BENCH_MW_TASKS", "").split(",") if n] or task_names()
    tasks: dict[str, Any] = {}
    start = time.perf_counter()
    env = MiniWoBEnv(max_steps=steps, max_elements=elements)
    try:
        for name in progress_bar(names, desc="miniwob pages", unit="task"):
            try:
                # a generator per task: a change on one page leaves the others' draws alone
                tasks[name] = play_task(env, name, episodes, random.Random(f"{SEED}/{name}"))
            except EnvError as err:  # one broken page must not end the survey
                tasks[name] = {"error": str(err).splitlines()[0][:200]}
                env.close()
                env = MiniWoBEnv(max_steps=steps, max_elements=elements)
    finally:
        env.close()
    played = {n: t for n, t in tasks.items() if "error" not in t}
    summary = {
        "tasks": len(tasks),
        "errors": len(tasks) - len(played),
        "won": sorted(n for n, t in played.items() if t["random_wins"]),
        "never_won": sorted(
            n for n, t in played.items() if not t["random_wins"] and t["admissible"] > 0
        ),
        "no_commands": sorted(n for n, t in played.items() if t["admissible"] == 0),
        "with_text_nodes": sorted(n for n, t in played.items() if t["text_nodes"]),
        "invalid_admissible": sum(t["invalid"] for t in played.values()),
    }
    out = {
        "episodes_per_task": episodes,
        "max_steps": steps,
        "max_elements": elements,
        "policy": f"random over the admissible commands (seed {SEED}, one generator per task)",
        "summary": summary,
        "tasks": tasks,
        "cpu": cpu_name(),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(RESULTS) as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    counts = {k: len(v) if isinstance(v, list) else v for k, v in summary.items()}
    print(json.dumps(counts))
    return out


if __name__ == "__main__":
    bench_parser("bench.miniwob_coverage", __doc__, ENV).parse_args()
    main()
