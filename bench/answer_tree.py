"""TextWorld episodes with and without the answer tree of their command paths.

``python -m bench.answer_tree`` (also part of ``make bench``) writes
bench/results/answer_tree.json. A small generated suite is played in passes as
evaluation plays its test games: each pass every game once, with a noisy expert (a
stand-in for a trained policy sampled at temperature 1) seeded per pass and game. The
same episodes run on envs sharing a pool that keeps nothing (every reset and step runs
the game) and on envs sharing the default pool (answers to known command paths are read
from its trees), alternating, ``ROUNDS`` times each; the fastest of each is reported,
with the share of resets and steps read from the trees and a check that both gave the
same episodes.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/answer_tree.json")
PASSES = 3  # sampled evaluation passes over the test games (agent.eval.passes)
REPEATS = 20  # copies of the suite's games per pass, so a pass is long enough to time
ROUNDS = 2  # runs of each variant, alternated
ENVS = 4  # envs sharing a pool (evaluation plays agent.eval.parallel_envs side by side)


def _play(tasks: list[Any], root: Path, pool: Any) -> tuple[float, list[Any]]:
    """Seconds to play every pass on ``ENVS`` envs sharing ``pool``; what they returned."""
    from components.data.policies import make_policy
    from components.envs.textworld_env import TextWorldEnv

    envs = [TextWorldEnv(max_steps=30, root=root, engines=pool) for _ in range(ENVS)]
    out: list[Any] = []
    start = time.perf_counter()
    for p in range(PASSES):
        for i, task in enumerate(tasks * REPEATS):
            env = envs[i % ENVS]
            policy = make_policy("noisy", seed=1000 * p + i, epsilon=0.2, p_invalid=0.05)
            obs, info = env.reset(task)
            out.append(obs)
            done = False
            while not done:
                obs, reward, terminated, truncated, info = env.step(policy.act(info, env))
                out.append((obs, reward, terminated, truncated))
                done = terminated or truncated
    seconds = time.perf_counter() - start
    for env in envs:
        env.close()
    return seconds, out


def main() -> None:
    """Write bench/results/answer_tree.json."""
    from bench.common import cpu_name
    from bench.envs import textworld_suite
    from components.envs.textworld_engines import EnginePool

    with tempfile.TemporaryDirectory(prefix="bench-answer-tree-") as tmp:
        root = Path(tmp)
        tasks, suite_s = textworld_suite(root)
        _play(tasks[:1], root, EnginePool(max_answers=0))  # warm imports and caches
        engines_s, tree_s, same = [], [], True
        share = 0.0
        for _ in range(ROUNDS):
            seconds, played = _play(tasks, root, EnginePool(max_answers=0))
            engines_s.append(seconds)
            pool = EnginePool()
            seconds, read = _play(tasks, root, pool)
            tree_s.append(seconds)
            same = same and read == played
            share = pool.answered / max(1, pool.answered + pool.played)
    result = {
        "cpu": cpu_name(),
        "games": len(tasks),
        "passes": PASSES,
        "episodes_per_pass": len(tasks) * REPEATS,
        "engines_only_seconds": round(min(engines_s), 2),
        "answer_tree_seconds": round(min(tree_s), 2),
        "speedup": round(min(engines_s) / min(tree_s), 2),
        "answered_share": round(share, 3),
        "same_episodes": same,
        "suite_seconds": round(suite_s, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    bench_parser("bench.answer_tree", __doc__).parse_args()
    main()
