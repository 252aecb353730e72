"""Does the synthetic env offer the commands the real env offers, and can experts win in it?

``python -m bench.admissible_commands`` (also part of ``make bench``), run from a project
root whose cpu-profile pipeline has run, writes bench/results/admissible_commands.json:

- ``composed``: on every real state of the unseen validation games (the initial state and
  each step's), the commands ``state_commands`` composes from the compact state against
  the real env's admissible list: exact-set match, F1, and the commands missed / added
  by verb (keys are not matched to their locks: extra ``lock``/``unlock`` are expected).
  Keys and food are learned from the train games' recorded commands only.
- ``walkthroughs``: each train game's expert walkthrough replayed in the grounded
  synthetic env (models/experience/full): how many end won, per family and difficulty
  band, and for the others the step where the dream departs (the command is not
  admissible there, or no reward at the end).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/admissible_commands.json")
TRAJECTORIES = Path("data/ingested/trajectories.jsonl")
TASKS_FILE = Path("data/tasks/tasks.jsonl")
MODEL_DIR = Path("models/experience/full")
MAX_STEPS = 30  # longer than any walkthrough of the cpu suite


def _band(task: Any) -> str:
    """quest 1-3 / 4-6, treasure 6-13 / 14-20: where the policies differ."""
    hard = task.difficulty > (3 if task.family == "quest" else 13)
    return f"{task.family}-{'hard' if hard else 'easy'}"


def measure_composed(trajectories: list[Any]) -> dict[str, Any]:
    """Composed vs real admissible commands on the validation games' real states."""
    from components.experience.grounded_commands import CommandRoles, state_commands

    roles = CommandRoles.learn(
        c
        for t in trajectories
        if t.split == "train"
        for s in t.steps
        for c in (s.admissible_actions or ())
    )
    n = exact = 0
    f1 = 0.0
    missed: Counter[str] = Counter()
    added: Counter[str] = Counter()
    for t in trajectories:
        if t.split != "validation" or t.source != "real":
            continue
        states = [t.initial_state, *(s.next_state for s in t.steps)]
        for state, step in zip(states, t.steps, strict=False):
            if not step.admissible_actions:
                continue
            real, composed = set(step.admissible_actions), set(state_commands(state, roles) or ())
            n += 1
            exact += real == composed
            f1 += 2 * len(real & composed) / (len(real) + len(composed))
            missed.update(c.split()[0] for c in real - composed)
            added.update(c.split()[0] for c in composed - real)
    return {
        "states": n,
        "exact_set_match": round(exact / n, 4) if n else None,
        "f1": round(f1 / n, 4) if n else None,
        "missed_by_verb": dict(missed.most_common()),
        "added_by_verb": dict(added.most_common()),
        "roles": {"keys": sorted(roles.keys), "food": len(roles.food)},
    }


def replay_walkthroughs(tasks: list[Any]) -> dict[str, Any]:
    """Each train walkthrough in the synthetic env: won, or where the dream departs."""
    from components.envs.base import ADMISSIBLE
    from components.experience.grounded import GroundedModel
    from components.experience.grounded_env import GroundedVectorEnv

    model = GroundedModel.load(MODEL_DIR)
    bands: dict[str, Counter[str]] = {}
    departures = []
    for task in tasks:
        if task.split != "train" or not task.walkthrough:
            continue
        env = GroundedVectorEnv(model, max_steps=MAX_STEPS, namespace="bench-walk")
        try:
            ((_, info),) = env.reset([task])
        except KeyError:  # no real episode of this game: nothing to dream from
            bands.setdefault(_band(task), Counter())["no_start"] += 1
            continue
        outcome, where = "not_won", len(task.walkthrough)
        for i, action in enumerate(task.walkthrough):
            if action not in (info.get(ADMISSIBLE) or ()):
                outcome, where = "not_admissible", i
                break
            ((_, reward, terminated, _, info),) = env.step([action])
            if terminated:
                outcome = "won" if reward > 0 else "lost"
                where = i
                break
        bands.setdefault(_band(task), Counter())[outcome] += 1
        if outcome != "won":
            departures.append({"task_id": task.task_id, "outcome": outcome, "step": where})
    return {
        "by_band": {b: dict(c) for b, c in sorted(bands.items())},
        "won": sum(c["won"] for c in bands.values()),
        "games": sum(sum(c.values()) for c in bands.values()),
        "not_won": departures,
    }


def main() -> dict[str, Any]:
    """Measure both and write the JSON."""
    from components.schema import Task, Trajectory, read_jsonl

    start = time.perf_counter()
    trajectories = list(read_jsonl(TRAJECTORIES, Trajectory))
    tasks = list(read_jsonl(TASKS_FILE, Task))
    out = {
        "composed": measure_composed(trajectories),
        "walkthroughs": replay_walkthroughs(tasks),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {k: out[k] for k in ("wall_seconds",)}
            | {
                "exact": out["composed"]["exact_set_match"],
                "won": out["walkthroughs"]["won"],
                "games": out["walkthroughs"]["games"],
            }
        )
    )
    return out


if __name__ == "__main__":
    bench_parser("bench.admissible_commands", __doc__).parse_args()
    main()
