"""Does the dream reward the commands no recorded episode played where the real game does?

``python -m bench.counterfactual_wins`` (also part of ``make bench``), run from a project
root whose cpu-profile TextWorld pipeline has run, writes
bench/results/counterfactual_wins.json.

Transition-level fidelity (metrics/fidelity.json) replays recorded actions; RL plays the
others. Here, along each train game's walkthrough, every command the real env admits at
each step is played once in the real game and once in the grounded dream
(models/experience/full), both from the walkthrough's prefix. The outcome pairs (real,
dream) in {won, lost, none} give the dream's precision and recall of wins on these
branches; a dreamt win the real game does not give is what RL learns to exploit. The
trivial baseline "never won" has precision undefined and recall 0. Branches where the
dream cannot follow the prefix (it departs from the real game earlier) are counted apart.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/counterfactual_wins.json")
MODEL_DIR = Path("models/experience/full")
MAX_STEPS = 30  # longer than any walkthrough of the cpu suite
OUTCOMES = ("won", "lost", "none")


def _outcome(won: bool, terminated: bool) -> str:
    return "won" if won else "lost" if terminated else "none"


def branch_outcomes(task: Any, real: Any, dream: Any) -> list[tuple[int, str, str, str]]:
    """(step, command, real outcome, dream outcome) for every real-admissible branch."""
    from components.envs.base import ADMISSIBLE, step_won

    def play(env: Any, prefix: list[str], command: str) -> tuple[str, dict[str, Any]] | None:
        if env is real:
            _, info = env.reset(task)
            for a in prefix:
                _, _, term, _, info = env.step(a)
            _, reward, term, _, info = env.step(command)
            return _outcome(step_won(info, reward), term), info
        ((_, info),) = env.reset([task])
        for a in prefix:
            (out,) = env.step([a])
            if out is None or out[2]:
                return None  # the dream ended before the branch point
        (out,) = env.step([command])
        if out is None:
            return None
        _, reward, term, _, info = out
        return _outcome(step_won(info, reward), term), info

    rows = []
    walk = list(task.walkthrough)
    for i in range(len(walk)):
        _, info = real.reset(task)
        for a in walk[:i]:
            _, _, _, _, info = real.step(a)
        for command in info.get(ADMISSIBLE) or ():
            r = play(real, walk[:i], command)
            d = play(dream, walk[:i], command)
            rows.append((i, command, r[0] if r else "none", d[0] if d else "departed"))
    return rows


def measure(tasks: list[Any], make_real: Any, model: Any) -> dict[str, Any]:
    """The (real, dream) outcome table over every train walkthrough's branches."""
    from components.experience.grounded_env import GroundedVectorEnv

    pairs: Counter[tuple[str, str]] = Counter()
    false_wins, missed_wins = [], []
    real = make_real()
    dream = GroundedVectorEnv(model, max_steps=MAX_STEPS, namespace="bench-counterfactual")
    games = 0
    try:
        for task in tasks:
            if task.split != "train" or not task.walkthrough:
                continue
            if model.initial_state(task.task_id) is None:
                continue
            games += 1
            for i, command, r, d in branch_outcomes(task, real, dream):
                pairs[(r, d)] += 1
                case = {"task_id": task.task_id, "step": i, "command": command}
                if d == "won" and r != "won":
                    false_wins.append(case)
                elif r == "won" and d not in ("won", "departed"):
                    missed_wins.append(case)
    finally:
        real.close()
    tp = pairs[("won", "won")]
    dreamt = sum(v for (_, d), v in pairs.items() if d == "won")
    real_wins = sum(v for (r, d), v in pairs.items() if r == "won" and d != "departed")
    return {
        "games": games,
        "branches": sum(pairs.values()),
        "departed": sum(v for (_, d), v in pairs.items() if d == "departed"),
        "pairs": {f"real_{r}/dream_{d}": v for (r, d), v in sorted(pairs.items())},
        "win_precision": round(tp / dreamt, 4) if dreamt else None,
        "win_recall": round(tp / real_wins, 4) if real_wins else None,
        "baseline_never_won": {"win_precision": None, "win_recall": 0.0},
        "false_wins": false_wins,
        "missed_wins": missed_wins,
    }


def main() -> dict[str, Any]:
    """Measure on the project's TextWorld train games and write the JSON."""
    from components.config import Paths, load_config
    from components.envs import env_factory
    from components.experience.grounded import GroundedModel, is_grounded_dir
    from components.stages.data import load_tasks

    cfg = load_config(Path("params.yaml"))
    if cfg.env.name != "textworld" or not is_grounded_dir(MODEL_DIR):
        print("bench.counterfactual_wins: needs the cpu TextWorld pipeline's grounded model")
        return {}
    start = time.perf_counter()
    paths = Paths(Path("."))
    out = measure(
        load_tasks(paths), env_factory(cfg.env, paths.root), GroundedModel.load(MODEL_DIR)
    )
    out["wall_seconds"] = round(time.perf_counter() - start, 1)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    keys = ("games", "branches", "win_precision", "win_recall", "wall_seconds")
    print(json.dumps({k: out[k] for k in keys} | {"false_wins": len(out["false_wins"])}))
    return out


if __name__ == "__main__":
    bench_parser("bench.counterfactual_wins", __doc__).parse_args()
    main()
