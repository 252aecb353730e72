"""Two designs of the cpu-profile policy compared on the validation games (issue: choose
the policy design on validation, never on test).

``python -m bench.policy_designs`` (also part of ``make bench``), run from a project whose
pipeline has run (it reads data/ingested/trajectories.jsonl and data/tasks), writes
bench/results/policy_designs.json:

- ``designs.<name>``: SFT on the same expert demonstrations as the train_sft stage (same
  epochs, learning rate, batch), one policy per seed, then one sampled episode per
  validation game and seed (temperature ``agent.eval.temperature``, as Table 1's
  headline); success with a 95% CI by bootstrap over games and seeds, per-seed success,
  and the accuracy of picking the expert's command on the validation demonstrations;
- ``random``: the random admissible policy on the same games and seeds;
- the designs (components/agent/features.py): ``full`` = frozen embeddings of the command
  and the current instruction sentence, room, inventory and last action, plus the episode
  memory's scalars (instruction pointer, tried commands, exits map); ``embeddings`` = the
  frozen embeddings alone, with the whole instruction in place of the current sentence
  (no episode memory beyond the last action).

Environment knobs: BENCH_DESIGN_SEEDS (default "0,1,2").
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/policy_designs.json")
SEEDS = tuple(int(s) for s in os.environ.get("BENCH_DESIGN_SEEDS", "0,1,2").split(","))
SPLIT = "validation"


def _rows(records: list[Any], seed: int) -> list[dict[str, Any]]:
    return [
        {"task_id": r.task_id, "seed": seed, "mode": "sampled", "success": int(r.success)}
        for r in records
    ]


def main() -> None:
    """Train and evaluate every design; write the JSON."""
    import torch

    from components.agent.evaluate import run_episodes
    from components.agent.features import DESIGNS
    from components.agent.loading import Acting, RandomAdmissible, new_scorer
    from components.agent.scorer_training import accuracy, expert_steps, train_sft_as
    from components.agent.table1 import mode_summary
    from components.config import PARAMS_FILE, Paths, load_config
    from components.envs import env_factory
    from components.stages.agent import load_trajectories
    from components.stages.data import load_tasks

    torch.set_num_threads(1)
    cfg = load_config(Path(PARAMS_FILE))
    paths = Paths(Path.cwd())
    trajectories = load_trajectories(paths)
    demos, _ = expert_steps(trajectories)
    held_out, _ = expert_steps(trajectories, split=SPLIT)
    tasks = [t for t in load_tasks(paths) if t.split == SPLIT]
    if not demos or not tasks:
        raise SystemExit("run the pipeline first: no demonstrations or no validation games")
    s, e = cfg.agent.sft, cfg.agent.eval
    make_env = env_factory(cfg.env, paths.root)
    out: dict[str, Any] = {"split": SPLIT, "games": len(tasks), "seeds": list(SEEDS)}
    rows: list[dict[str, Any]] = []
    for seed in SEEDS:
        rows += _rows(run_episodes(RandomAdmissible(seed), tasks, make_env, seed=seed), seed)
    out["random"] = mode_summary(rows, "sampled")
    out["designs"] = {}
    for design in DESIGNS:
        scorer = cfg.agent.scorer.model_copy(update={"design": design})
        dcfg = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"scorer": scorer})})
        rows, accs, start = [], [], time.perf_counter()
        for seed in SEEDS:
            policy = new_scorer(dcfg, seed)
            train_sft_as(policy, demos, s, seed)
            accs.append(accuracy(policy, held_out) if held_out else None)
            torch.manual_seed(seed)
            actor = Acting(policy, e.temperature, e.max_new_tokens)
            rows += _rows(run_episodes(actor, tasks, make_env, seed=seed), seed)
        summary = mode_summary(rows, "sampled") or {}
        summary["validation_expert_accuracy"] = [a for a in accs if a is not None]
        summary["seconds"] = round(time.perf_counter() - start, 1)
        out["designs"][design] = summary
        print(f"{design}: validation success {summary.get('success', 0):.3f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    out["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "git_commit": commit.stdout.strip(),
        "profile": cfg.profile,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    bench_parser(
        "bench.policy_designs",
        __doc__,
        env={"BENCH_DESIGN_SEEDS": "training seeds per design, comma-separated (default 0,1,2)"},
    ).parse_args()
    main()
