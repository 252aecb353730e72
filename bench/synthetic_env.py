"""Synthetic (grounded experience model) vs real environment throughput, side by side.

``python -m bench.synthetic_env`` (also part of ``make bench``), run from a project root
whose cpu-profile pipeline trained the grounded experience model, writes
bench/results/synthetic_env.json:

- ``real_steps_per_s`` per real env: TextWorld on the project's train games (as the RL
  loop makes it: no expert plan), plus ScienceWorld and MiniWoB++ when their adapters
  start on this machine (reported as skipped otherwise). Step time only; resets are
  reported next to it (``real_steps_per_s_with_resets``).
- ``synthetic_steps_per_s`` per batch size ("1", "8", "32", "128"): env steps per second
  of ``GroundedVectorEnv`` (components/experience/grounded_env.py) driven by the saved
  grounded model (models/experience/full). Step calls only: the actions are chosen
  outside the timing, and no policy runs. Every episode either replays the recorded
  actions of its task (expert trajectories first) and then plays random admissible
  commands, or plays random admissible commands from the start (alternating); finished
  slots restart at once (``restart_finished``), so every step call serves a full batch.
  Each batch size runs step calls until its time budget is spent (at least one call).
  The same action rule drives TextWorld, so both envs see the same kind of episodes.
- ``ratio_vs_slowest_real``: best synthetic steps/s over the slowest real env (step
  time only; target >= 2); ``batch_speedup``: steps/s of each batch size over batch 1
  (target: batch 32 >= 3x).
- where the time goes: per batch size the share of replayed / map / edit steps and of
  steps the classifiers decided and the seconds Python's garbage collector took, and a
  cProfile of step calls at batch 1 and 32 (outside the timing): the share of step time
  in the model's table lookups, its classifiers, the features, and the env's recording
  (transition records, episode memory, info), plus the top functions by own time.
  ``batch_scaling`` bounds what batching can give: only the classifier calls are paid
  once per step call; everything else is per episode step (rule-based Python), so
  batch b cannot beat batch 1 by more than 1 / (1 - classifier share at batch 1).

Environment knobs: BENCH_SYNTH_MODEL (model dir, default models/experience/full),
BENCH_SYNTH_TRAJECTORIES (recorded trajectories, default data/ingested/trajectories.jsonl),
BENCH_SYNTH_SECONDS (budget per batch size, default 20), BENCH_SYNTH_BATCHES (default
1,8,32,128), BENCH_SYNTH_PROFILE (1: profile, the default), BENCH_SYNTH_THREADS (torch
threads, default 1), BENCH_REAL_SECONDS (budget per real env, default 20),
BENCH_REAL_ENVS (default textworld,scienceworld,miniwob).
"""

from __future__ import annotations

import cProfile
import gc
import json
import os
import platform
import pstats
import random
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/synthetic_env.json")
MODEL_DIR = Path(os.environ.get("BENCH_SYNTH_MODEL", "models/experience/full"))
TRAJECTORIES = Path(os.environ.get("BENCH_SYNTH_TRAJECTORIES", "data/ingested/trajectories.jsonl"))
TASKS_FILE = Path("data/tasks/tasks.jsonl")
BATCH_SIZES = tuple(int(b) for b in os.environ.get("BENCH_SYNTH_BATCHES", "1,8,32,128").split(","))
BUDGET_S = float(os.environ.get("BENCH_SYNTH_SECONDS", "20"))
PROFILE = os.environ.get("BENCH_SYNTH_PROFILE", "1") == "1"
PROFILE_BATCHES = (1, 32)
PROFILE_S = 3.0
THREADS = int(os.environ.get("BENCH_SYNTH_THREADS", "1"))
REAL_S = float(os.environ.get("BENCH_REAL_SECONDS", "20"))
REAL_ENVS = tuple(
    e for e in os.environ.get("BENCH_REAL_ENVS", "textworld,scienceworld,miniwob").split(",") if e
)
MAX_STEPS = 20  # the cpu profile's synthetic.max_steps and env.max_steps
GOAL_RATIO = 2.0  # synthetic >= 2x the slowest real env
GOAL_BATCH_SPEEDUP = 3.0  # batch 32 >= 3x batch 1
FALLBACK_ACTION = "look"
# what the profile groups step time by: (label, function name, the end of its file path)
PHASES = (
    ("tables", "_draft", "experience/grounded_drafts.py"),
    ("features", "outcome_features", "experience/grounded_outcome.py"),
    ("classifiers", "_classify_rows", "experience/grounded.py"),
    ("record", "_advance", "experience/grounded_env.py"),
    ("record.transition", "_transition", "experience/grounded_env.py"),
    ("record.memory", "update", "components/memory.py"),
)


def _machine() -> dict[str, Any]:
    import numpy
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    from bench.common import cpu_name

    return {
        "platform": platform.platform(),
        "processor": cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "git_commit": commit,
    }


# ---------------------------------------------------------------------- actions


class Actions:
    """The bench's action rule, the same for the synthetic and the real env.

    Episode ``n`` of a slot: even -> the recorded actions of its task (an expert's when
    there is one), then random admissible commands; odd -> random admissible commands.
    """

    def __init__(self, script: dict[str, list[str]], seed: int = 0) -> None:
        self.script = script
        self.rng = random.Random(seed)

    def choose(self, task_id: str, episode: int, step: int, admissible: Any) -> str:
        seq = self.script.get(task_id, ()) if episode % 2 == 0 else ()
        if step < len(seq):
            return seq[step]
        return self.rng.choice(list(admissible)) if admissible else FALLBACK_ACTION


def _scripts() -> dict[str, list[str]]:
    """A recorded train action sequence per task (the expert's when there is one)."""
    from components.schema import Trajectory, read_jsonl

    script: dict[str, list[str]] = {}
    experts: set[str] = set()
    for t in read_jsonl(TRAJECTORIES, Trajectory):
        if t.split != "train" or t.source != "real" or t.task_id in experts:
            continue
        if t.policy == "expert" or t.task_id not in script:
            script[t.task_id] = [s.action for s in t.steps]
            if t.policy == "expert":
                experts.add(t.task_id)
    return script


def _train_tasks() -> list[Any]:
    from components.schema import Task, read_jsonl

    return [t for t in read_jsonl(TASKS_FILE, Task) if t.split == "train"]


# ---------------------------------------------------------------------- real envs


def _run_real(env: Any, tasks: list[Any], pick: Any, budget_s: float) -> dict[str, Any]:
    """Play episodes round-robin over ``tasks`` for ``budget_s`` seconds of stepping."""
    from components.envs.base import ADMISSIBLE

    step_s = reset_s = 0.0
    steps = episodes = 0
    started = time.perf_counter()
    while step_s < budget_s and time.perf_counter() - started < 3 * budget_s + 60:
        task = tasks[episodes % len(tasks)]
        t0 = time.perf_counter()
        _, info = env.reset(task)
        reset_s += time.perf_counter() - t0
        n, done = 0, False
        while not done:
            action = pick(env, task, episodes, n, info.get(ADMISSIBLE))
            t0 = time.perf_counter()
            _, _, terminated, truncated, info = env.step(action)
            step_s += time.perf_counter() - t0
            steps, n = steps + 1, n + 1
            done = terminated or truncated
        episodes += 1
    return {
        "steps": steps,
        "episodes": episodes,
        "step_seconds": round(step_s, 3),
        "reset_seconds": round(reset_s, 3),
        "steps_per_s": round(steps / step_s, 2),
        "steps_per_s_with_resets": round(steps / (step_s + reset_s), 2),
    }


def measure_textworld(script: dict[str, list[str]], budget_s: float) -> dict[str, Any]:
    """TextWorld on the train games, with the synthetic env's action rule."""
    from components.config import EnvConfig
    from components.envs import env_factory

    tasks = [t for t in _train_tasks() if t.game_file]
    actions = Actions(script, seed=0)
    env = env_factory(EnvConfig(name="textworld", max_steps=MAX_STEPS), Path.cwd())()

    def pick(_env: Any, task: Any, episode: int, step: int, admissible: Any) -> str:
        return actions.choose(task.task_id, episode, step, admissible)

    try:
        out = _run_real(env, tasks, pick, budget_s)
    finally:
        env.close()
    return {**out, "games": len(tasks), "actions": "recorded then random admissible"}


def _adapter_tasks(name: str, families: list[str]) -> list[Any]:
    from components.schema import Task

    return [
        Task(
            task_id=f"bench-{name}-{fam}-{v}",
            env=name,
            family=fam,
            difficulty=1,
            split="train",
            instruction=f"bench {fam}",
            seed=v,
        )
        for fam in families
        for v in range(2)
    ]


def measure_adapter(name: str, budget_s: float) -> dict[str, Any]:
    """ScienceWorld / MiniWoB++ (expert and random admissible episodes, alternating)."""
    from components.config import EnvConfig
    from components.envs import make_env

    env_cfg = EnvConfig(name=name, max_steps=MAX_STEPS)  # type: ignore[arg-type]
    families = list(getattr(getattr(env_cfg, name), "task_names", ()))[:3]
    rng = random.Random(0)

    def pick(env: Any, _task: Any, episode: int, _step: int, admissible: Any) -> str:
        action = env.expert_action() if episode % 2 == 0 else None
        return action or (rng.choice(list(admissible)) if admissible else FALLBACK_ACTION)

    t0 = time.perf_counter()
    env = make_env(env_cfg, Path.cwd(), expert=True)
    try:
        out = _run_real(env, _adapter_tasks(name, families), pick, budget_s)
    finally:
        env.close()
    return {**out, "families": families, "wall_seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------- synthetic


class _Driver:
    """A full batch of grounded episodes: actions per slot, restarts of finished slots."""

    def __init__(self, model: Any, tasks: list[Any], script: dict[str, list[str]], b: int):
        from components.experience.grounded_env import GroundedVectorEnv

        self.env = GroundedVectorEnv(model, max_steps=MAX_STEPS, namespace=f"bench-{b}")
        self.env.reset([tasks[i % len(tasks)] for i in range(b)], seed=0)
        self.actions = Actions(script, seed=b)
        self.episode = list(range(b))  # slot i starts with mode i % 2

    def next_actions(self) -> list[str]:
        return [
            self.actions.choose(s.task.task_id, self.episode[i], len(s.steps), s.admissible)
            for i, s in enumerate(self.env._slots)
        ]

    def restart(self) -> None:
        # the finished episodes are dropped: an RL round keeps only its own, then writes them
        for i in self.env.restart_finished(keep=False):
            self.episode[i] += 1


class _GcClock:
    """Seconds spent in Python's garbage collector while enabled (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections: Counter[int] = Counter()
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1

    def __enter__(self) -> _GcClock:
        gc.collect()  # the previous run's garbage is not charged to this one
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def measure_synthetic(
    model: Any, tasks: list[Any], script: dict[str, list[str]], b: int, budget_s: float
) -> dict[str, Any]:
    """Steps/s of a full batch of ``b`` grounded episodes for about ``budget_s``."""
    drv = _Driver(model, tasks, script, b)
    calls = 0
    step_s = 0.0
    with _GcClock() as gc_clock:
        while calls == 0 or step_s < budget_s:
            actions = drv.next_actions()
            t0 = time.perf_counter()
            drv.env.step(actions)
            step_s += time.perf_counter() - t0
            drv.restart()
            calls += 1
    m = drv.env.metrics()
    steps = int(m["steps"])
    decided = sum(
        m.get(f"evidence_{e}", 0.0) for e in ("map", "edit", "unknown_room")
    )  # the classifiers decide every step that is not replayed
    return {
        "batch_size": b,
        "step_calls": calls,
        "steps": steps,
        "seconds": round(step_s, 3),
        "steps_per_s": round(steps / step_s, 1),
        "us_per_step": round(1e6 * step_s / steps, 1),
        "us_per_call": round(1e6 * step_s / calls, 1),
        # collections triggered anywhere in the loop (mostly in step calls: they allocate)
        "gc_seconds": round(gc_clock.seconds, 3),
        "gc_collections": {str(g): n for g, n in sorted(gc_clock.collections.items())},
        "episodes_finished": int(m["episodes"]) - b,  # every finished one was restarted
        "successes": int(m.get("successes", 0)),
        "share_by_evidence": {
            k[len("evidence_") :]: round(v / steps, 3)
            for k, v in sorted(m.items())
            if k.startswith("evidence_")
        },
        "share_classifier_decided": round(decided / steps, 3),
        "admissible_fallback_share": m["admissible_fallback_share"],
    }


def profile_synthetic(
    model: Any, tasks: list[Any], script: dict[str, list[str]], b: int, seconds: float
) -> dict[str, Any]:
    """cProfile of step calls at batch ``b`` (not the timed run): phases and hot spots."""
    drv = _Driver(model, tasks, script, b)
    prof = cProfile.Profile()
    start = time.perf_counter()
    calls = 0
    while calls == 0 or time.perf_counter() - start < seconds:
        actions = drv.next_actions()
        prof.enable()
        drv.env.step(actions)
        prof.disable()
        drv.restart()
        calls += 1
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(
        ct
        for (file, _, name), (_, _, _, ct, _) in stats.items()
        if name == "step" and file.endswith("grounded_env.py")
    )
    phases = {}
    for label, func, suffix in PHASES:
        cum = sum(
            ct
            for (file, _, name), (_, _, _, ct, _) in stats.items()
            if name == func and file.endswith(suffix)
        )
        phases[label] = round(cum / total, 3) if total else 0.0
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    return {
        "batch_size": b,
        "step_calls": calls,
        "steps": calls * b,
        "profiled_step_seconds": round(total, 3),
        "share_of_step_time": phases,
        "top_own_time": [
            {
                "function": f"{Path(file).name}:{line}({name})",
                "calls": nc,
                "own_s": round(tt, 4),
                "share": round(tt / total, 3) if total else 0.0,
            }
            for (file, line, name), (_, nc, tt, _, _) in top
        ],
    }


# ---------------------------------------------------------------------- main


def main() -> dict[str, Any]:
    """Measure real and synthetic envs side by side; write the JSON."""
    import torch

    from components.experience.grounded import GroundedModel

    torch.set_num_threads(THREADS)
    started = time.perf_counter()
    machine = _machine()
    script = _scripts()
    real: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in REAL_ENVS:
        try:
            real[name] = (
                measure_textworld(script, REAL_S)
                if name == "textworld"
                else measure_adapter(name, REAL_S)
            )
            print(f"{name}: {real[name]['steps_per_s']} steps/s", flush=True)
        except Exception as err:  # an adapter that cannot start here is reported, not fatal
            skipped[name] = f"{type(err).__name__}: {str(err)[:300]}"
            print(f"{name}: skipped ({skipped[name]})", flush=True)

    t0 = time.perf_counter()
    model = GroundedModel.load(MODEL_DIR)
    load_s = time.perf_counter() - t0
    tasks = [t for t in _train_tasks() if model.initial_state(t.task_id)]
    if not tasks:
        raise ValueError(f"no train task of {TASKS_FILE} has a recorded first state in the model")
    measure_synthetic(model, tasks, script, max(BATCH_SIZES), 0.5)  # warm the caches
    synthetic: dict[str, Any] = {}
    for b in BATCH_SIZES:
        synthetic[str(b)] = measure_synthetic(model, tasks, script, b, BUDGET_S)
        print(f"synthetic batch {b}: {synthetic[str(b)]['steps_per_s']} steps/s", flush=True)
    profiles = (
        {str(b): profile_synthetic(model, tasks, script, b, PROFILE_S) for b in PROFILE_BATCHES}
        if PROFILE
        else {}
    )

    batch_scaling: dict[str, Any] = {}
    if "1" in profiles:  # the per-call part of a batch-1 step: what batching can amortise
        share = profiles["1"]["share_of_step_time"]["classifiers"]
        batch_scaling = {
            "classifier_share_at_batch_1": share,
            "speedup_bound": round(1 / max(1e-9, 1 - share), 2),
        }
    real_sps = {k: v["steps_per_s"] for k, v in real.items()}
    real_with_resets = {k: v["steps_per_s_with_resets"] for k, v in real.items()}
    synth_sps = {k: v["steps_per_s"] for k, v in synthetic.items()}
    best = max(synth_sps, key=synth_sps.__getitem__)
    slowest = min(real_sps, key=real_sps.__getitem__) if real_sps else None
    ratio = round(synth_sps[best] / real_sps[slowest], 2) if slowest else None
    base = synth_sps.get("1")
    speedup = {k: round(v / base, 2) for k, v in synth_sps.items()} if base else {}
    result = {
        "real_steps_per_s": real_sps,
        "synthetic_steps_per_s": synth_sps,
        "ratio_vs_slowest_real": ratio,
        "slowest_real": {"env": slowest, "steps_per_s": real_sps.get(slowest or "")},
        "real_steps_per_s_with_resets": real_with_resets,
        "ratio_vs_slowest_real_with_resets": (
            round(synth_sps[best] / min(real_with_resets.values()), 2) if real_with_resets else None
        ),
        "best_synthetic": {"batch_size": int(best), "steps_per_s": synth_sps[best]},
        "batch_speedup": speedup,
        "batch_scaling": batch_scaling,
        "goal": {
            "ratio_vs_slowest_real": GOAL_RATIO,
            "ratio_met": ratio is not None and ratio >= GOAL_RATIO,
            "batch32_over_batch1": GOAL_BATCH_SPEEDUP,
            "batch_speedup_met": speedup.get("32", 0.0) >= GOAL_BATCH_SPEEDUP,
        },
        "real": real,
        "real_skipped": skipped,
        "synthetic": synthetic,
        "profile": profiles,
        "model": {
            "kind": "grounded",
            "dir": str(MODEL_DIR),
            "load_seconds": round(load_s, 2),
            "fit_stats": model.fit_stats,
            "settings": vars(model.settings),
            "train_tasks_with_a_first_state": len(tasks),
            "tasks_with_recorded_actions": sum(t.task_id in script for t in tasks),
        },
        "settings": {
            "budget_seconds_per_batch_size": BUDGET_S,
            "budget_seconds_per_real_env": REAL_S,
            "max_steps": MAX_STEPS,
            "torch_threads": THREADS,
            "actions": "per slot, alternating episodes: the task's recorded actions (expert "
            "first) then random admissible; random admissible from the start. Finished slots "
            "restart; actions are chosen outside the timed step calls.",
            "trajectories": str(TRAJECTORIES),
        },
        "machine": machine,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    keys = ("real_steps_per_s", "synthetic_steps_per_s", "ratio_vs_slowest_real", "batch_speedup")
    print(json.dumps({k: result[k] for k in keys}), flush=True)
    return result


if __name__ == "__main__":
    bench_parser(
        "bench.synthetic_env",
        __doc__,
        env={
            "BENCH_SYNTH_MODEL": "grounded model folder (default models/experience/full)",
            "BENCH_SYNTH_TRAJECTORIES": "recorded trajectories "
            "(default data/ingested/trajectories.jsonl)",
            "BENCH_SYNTH_SECONDS": "time budget per batch size (default 20)",
            "BENCH_SYNTH_BATCHES": "batch sizes, comma-separated (default 1,8,32,128)",
            "BENCH_SYNTH_PROFILE": "1: profile the step calls (the default), else 0",
            "BENCH_SYNTH_THREADS": "torch threads (default 1)",
            "BENCH_REAL_SECONDS": "time budget per real env (default 20)",
            "BENCH_REAL_ENVS": "real envs, comma-separated "
            "(default textworld,scienceworld,miniwob)",
        },
    ).parse_args()
    main()
