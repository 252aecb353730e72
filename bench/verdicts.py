"""Does the experience model end episodes where the real env ended them, step by step?

``python -m bench.verdicts`` (also part of ``make bench``), run from a project root whose
pipeline has run (any env), writes bench/results/verdicts_<env>.json: every real step of the
train and validation trajectories (never test: held out), fed through the fitted grounded
model (models/experience/full) with the episode's real history, and its verdict (goes on,
won, lost) against the real one, per split and task family, with the evidence that
decided it (a replayed outcome, an edit, the map). Train steps are what the dream replays
while DreamGym trains, so a disagreement there is a dream that contradicts its own data.

``undecided_keys`` counts the replay keys (game, state text, command) whose recorded
endings disagree (the state's text does not decide the ending: click-button-sequence's
page looks the same before and after its first click), and how many of them the
previous command resolves.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/verdicts_{env}.json")  # one file per env's project
TRAJECTORIES = Path("data/ingested/trajectories.jsonl")
TASKS_FILE = Path("data/tasks/tasks.jsonl")
MODEL_DIR = Path("models/experience/full")
SPLITS = ("train", "validation")


def _verdict(won: bool, lost: bool) -> str:
    return "won" if won else "lost" if lost else "goes_on"


def step_verdicts(model: Any, tasks: dict[str, Any], trajectories: list[Any]) -> dict[str, Any]:
    """Real against predicted verdicts of every train / validation step, per family."""
    from components.experience.grounded_outcome import episode_rows

    cells: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for traj in trajectories:
        if traj.split not in SPLITS or traj.source != "real" or traj.task_id not in tasks:
            continue
        task = tasks[traj.task_id]
        for mem, step, lost in episode_rows([traj]):
            out = model.predict(task, mem, step.state, step.action, step.admissible_actions or ())
            real = _verdict(step.done and step.reward == 1, lost)
            pred = _verdict(out.won, out.lost)
            cell = cells[(traj.split, task.family)]
            cell["steps"] += 1
            cell["agree"] += real == pred
            if real != pred:
                cell[f"{real}->{pred}"] += 1
                cell[f"by_{out.evidence}"] += 1
    out: dict[str, Any] = {}
    for split in SPLITS:
        fams = {f: dict(c) for (s, f), c in sorted(cells.items()) if s == split}
        steps = sum(c["steps"] for c in fams.values())
        agree = sum(c["agree"] for c in fams.values())
        out[split] = {
            "steps": steps,
            "agreement": round(agree / steps, 4) if steps else None,
            "families": fams,
        }
    return out


def undecided_keys(model: Any) -> dict[str, Any]:
    """Replay keys whose recorded endings disagree, and those the previous command decides."""
    after: dict[tuple[str, str, str], list[Counter]] = defaultdict(list)
    for (game, state, _, action), outcomes in model.exact_after.items():
        after[(game, state, action)].append(outcomes)
    by_game: Counter[str] = Counter()
    resolved = 0
    for key, outcomes in model.exact.items():
        if len({o[2:] for o in outcomes}) <= 1:
            continue
        by_game[key[0]] += 1
        resolved += bool(after[key]) and all(len({o[2:] for o in c}) == 1 for c in after[key])
    return {
        "keys": len(model.exact),
        "undecided": sum(by_game.values()),
        "resolved_by_previous_command": resolved,
        "games": len(by_game),
    }


def main() -> dict[str, Any]:
    """Measure and write the JSON."""
    from components.experience.grounded import GroundedModel
    from components.schema import Task, Trajectory, read_jsonl

    start = time.perf_counter()
    model = GroundedModel.load(MODEL_DIR)
    tasks = {t.task_id: t for t in read_jsonl(TASKS_FILE, Task)}
    trajectories = list(read_jsonl(TRAJECTORIES, Trajectory))
    env = next((t.env for t in tasks.values()), "")
    out = {
        "env": env,
        **step_verdicts(model, tasks, trajectories),
        "undecided_keys": undecided_keys(model),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    path = Path(str(RESULTS).format(env=env or "unknown"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {
                "env": env,
                **{s: out[s]["agreement"] for s in SPLITS},
                "undecided_keys": out["undecided_keys"],
            }
        )
    )
    return out


if __name__ == "__main__":
    bench_parser("bench.verdicts", __doc__).parse_args()
    main()
