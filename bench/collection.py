"""Real-env throughput: TextWorld steps/s (expert, random), replay calls/s, collection.

Generates one small game per family in a temporary project (timed separately, excluded
from the step rates), then times single-process stepping with the expert and the random
policy, ``replay`` of random prefixes (a reset + prefix each call) and of consecutive
prefixes (the fast path), and a full ``collect`` with 2 worker processes. Writes
bench/results/collection.json. About a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results")
MIN_SECONDS = 8.0  # per stepping measurement
REPLAY_CALLS = 300


def _device() -> str:
    from bench.common import cpu_name

    return f"cpu: {cpu_name()} ({os.cpu_count()} cores)"


def _config() -> Any:
    from components.config.small import small_config

    return small_config(
        [("quest", 2, 3, 6), ("cooking", 2, 1, 3), ("treasure", 2, 5, 15)],
        profile="cpu",
        seed=123,
        max_steps=30,
        split=(0.6, 0.1),
        episodes={"expert": 2, "noisy": 8, "random": 4},
        splits=("train", "validation", "test"),
        workers=2,
    )


def _step_rate(env: Any, tasks: list, policy: str, cfg: Any) -> dict[str, Any]:
    from components.data.collect import EpisodePlan, run_episode

    steps = episodes = wins = 0
    start = time.perf_counter()
    while time.perf_counter() - start < MIN_SECONDS:
        for task in tasks:
            plan = EpisodePlan(f"bench-{episodes}", task.task_id, policy, episodes, episodes)
            traj = run_episode(env, task, plan, cfg.collect.epsilon, cfg.collect.p_invalid)
            steps += traj.n_steps
            episodes += 1
            wins += int(traj.success)
    seconds = time.perf_counter() - start
    return {
        "steps_per_s": round(steps / seconds, 1),
        "n_steps": steps,
        "n_episodes": episodes,
        "success_rate": round(wins / episodes, 3),
        "seconds": round(seconds, 2),
    }


def _replay_rates(env: Any, tasks: list, cfg: Any) -> dict[str, Any]:
    from components.data.collect import EpisodePlan, run_episode

    rng = random.Random(0)
    episodes = [
        (task, run_episode(env, task, EpisodePlan("r", task.task_id, "random", 0, i), 0.3, 0.05))
        for i, task in enumerate(tasks)
    ]
    queries = []
    for _ in range(REPLAY_CALLS):
        task, traj = rng.choice(episodes)
        actions = [s.action for s in traj.steps]
        i = rng.randrange(len(actions))
        queries.append((task, actions[:i], actions[i]))
    start = time.perf_counter()
    for task, prefix, action in queries:
        env.replay(task, prefix, action)
    random_order = time.perf_counter() - start
    n_seq = 0
    start = time.perf_counter()
    for task, traj in episodes:
        actions = [s.action for s in traj.steps]
        for i in range(len(actions)):
            env.replay(task, actions[:i], actions[i])
            n_seq += 1
    sequential = time.perf_counter() - start
    return {
        "replay_calls_per_s": round(len(queries) / random_order, 1),
        "replay_mean_prefix_len": round(sum(len(q[1]) for q in queries) / len(queries), 2),
        "replay_sequential_calls_per_s": round(n_seq / sequential, 1),
        "replay_n_calls": len(queries) + n_seq,
    }


def main() -> dict[str, Any]:
    """Run the benchmark; writes bench/results/collection.json."""
    from components.data.collect import collect
    from components.envs.textworld_env import TextWorldEnv
    from components.envs.textworld_tasks import GAMES_DIR, META_SUFFIX, generate_task_suite

    with tempfile.TemporaryDirectory(prefix="bench-tw-") as tmp:
        root = Path(tmp)
        cfg = _config()
        start = time.perf_counter()
        tasks = generate_task_suite(cfg, root / "data" / "tasks", progress=False, root=root)
        gen_wall = time.perf_counter() - start
        per_family: dict[str, list[float]] = {}
        for task in tasks:
            meta_file = root / "data" / "tasks" / GAMES_DIR / f"{task.task_id}{META_SUFFIX}"
            meta = json.loads(meta_file.read_text())
            per_family.setdefault(task.family, []).append(meta["seconds"])

        env = TextWorldEnv(max_steps=cfg.env.max_steps, root=root)
        expert = _step_rate(env, tasks, "expert", cfg)
        rand = _step_rate(env, tasks, "random", cfg)
        replay = _replay_rates(env, tasks, cfg)
        env.close()
        summary = collect(cfg, tasks, root / "data" / "raw", root, progress=False)

    n_steps = expert["n_steps"] + rand["n_steps"]
    seconds = expert["seconds"] + rand["seconds"]
    result = {
        "textworld": {
            "steps_per_s": round(n_steps / seconds, 1),
            "expert": expert,
            "random": rand,
            **replay,
            "collect_2_workers": {
                "steps_per_s": summary["steps_per_s"],
                "n_transitions": summary["n_transitions"],
                "n_trajectories": summary["n_trajectories"],
                "seconds": summary["seconds"],
                "success_rate": {p: v["success_rate"] for p, v in summary["policies"].items()},
            },
            "generation_s_per_game": {
                f: round(sum(v) / len(v), 2) for f, v in sorted(per_family.items())
            },
            "generation_wall_s": round(gen_wall, 2),
            "n_games": len(tasks),
        },
        "device": _device(),
        "n_steps": n_steps,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "collection.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    bench_parser("bench.collection", __doc__).parse_args()
    main()
