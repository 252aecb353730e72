"""Synthetic vs real environment throughput, measured side by side in one run.

``python -m bench.synthetic_env`` (also part of ``make bench``) writes
bench/results/synthetic_env.json:

- ``real_steps_per_s`` per real env: TextWorld on the project's train games (expert and
  random admissible actions), plus ScienceWorld and MiniWoB++ when their adapters start
  on this machine (the slow class of env DreamGym is meant to replace). Step time only;
  resets are reported next to it.
- ``synthetic_steps_per_s`` per batch size (1, 8, 32, 128): env steps per second of
  ``VectorSyntheticEnv`` driven by the trained cpu-profile experience model
  (models/experience; an untrained tiny model when absent, and the JSON says which) with
  the cpu profile's generation settings and k retrieved transitions from data/buffer.
  Actions replay real trajectories of each slot's task; finished slots restart at once,
  so every step call serves a full batch. Each batch size runs step calls until its time
  budget is spent (at least one call).
- ``ratio_vs_slowest_real``: best batched synthetic steps/s over the slowest real env
  (step time only); ``ratio_vs_slowest_real_with_resets`` counts the real resets too.
- where the time goes: retrieval / generation / resampling / other per step call, tokens
  per answer, and a torch-profiler table of one batch-8 step call.

Environment knobs: BENCH_SYNTH_MODEL (model dir), BENCH_SYNTH_SECONDS (budget per batch
size), BENCH_SYNTH_THREADS (torch threads; 1 by default: on a contended 2-core machine
two threads measured ~10x slower), BENCH_REAL_STEPS, BENCH_SYNTH_BATCHES, BENCH_SYNTH_PROFILE.
"""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

RESULTS = Path("bench/results/synthetic_env.json")
# the experience stage writes models/experience (older runs) or models/experience/<variant>
MODEL_CANDIDATES = (Path("models/experience"), Path("models/experience/full"))
MODEL_DIR = Path(
    os.environ.get("BENCH_SYNTH_MODEL")
    or next((str(d) for d in MODEL_CANDIDATES if (d / "config.json").exists()), "models/experience")
)
BUFFER_DIR = Path(os.environ.get("BENCH_SYNTH_BUFFER", "data/buffer"))
BATCH_SIZES = tuple(int(b) for b in os.environ.get("BENCH_SYNTH_BATCHES", "1,8,32,128").split(","))
BUDGET_S = float(os.environ.get("BENCH_SYNTH_SECONDS", "60"))
THREADS = int(os.environ.get("BENCH_SYNTH_THREADS", "1"))
REAL_STEPS = int(os.environ.get("BENCH_REAL_STEPS", "300"))
PROFILE = os.environ.get("BENCH_SYNTH_PROFILE", "1") == "1"
REFERENCE_SLOW_ENV = 10.0  # steps/s of the MiniWoB/ScienceWorld class (the goal)
GOAL_RATIO = 20.0
FALLBACK_ACTION = "look"


def _machine() -> dict[str, Any]:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "git_commit": commit,
    }


# ---------------------------------------------------------------------- real envs


def _run_real(env: Any, tasks: list[Any], n_steps: int, seed: int) -> dict[str, Any]:
    """Alternate expert and random-admissible episodes over ``tasks`` for ``n_steps`` steps."""
    from components.envs.base import ADMISSIBLE

    rng = random.Random(seed)
    step_s = reset_s = 0.0
    steps = episodes = 0
    policies: Counter[str] = Counter()
    while steps < n_steps:
        task = tasks[episodes % len(tasks)]
        policy = "expert" if episodes % 2 == 0 else "random"
        t0 = time.perf_counter()
        _, info = env.reset(task)
        reset_s += time.perf_counter() - t0
        episodes += 1
        done = False
        while not done and steps < n_steps:
            action = env.expert_action() if policy == "expert" else None
            if action is None:
                action = rng.choice(info.get(ADMISSIBLE) or [FALLBACK_ACTION])
            t0 = time.perf_counter()
            _, _, terminated, truncated, info = env.step(action)
            step_s += time.perf_counter() - t0
            steps += 1
            policies[policy] += 1
            done = terminated or truncated
    return {
        "steps": steps,
        "episodes": episodes,
        "step_seconds": round(step_s, 3),
        "reset_seconds": round(reset_s, 3),
        "steps_per_s": round(steps / step_s, 2),
        "steps_per_s_with_resets": round(steps / (step_s + reset_s), 2),
        "steps_by_policy": dict(policies),
    }


def measure_textworld(n_steps: int) -> dict[str, Any]:
    """TextWorld on the train games of data/tasks."""
    from components.config import EnvConfig
    from components.envs import make_env
    from components.schema import Task, read_jsonl

    tasks = [t for t in read_jsonl(Path("data/tasks/tasks.jsonl"), Task) if t.split == "train"]
    env = make_env(EnvConfig(name="textworld", max_steps=30), Path.cwd())
    try:
        out = _run_real(env, tasks, n_steps, seed=0)
    finally:
        env.close()
    return {**out, "games": len(tasks)}


def _adapter_tasks(name: str, families: list[str], env_name: str) -> list[Any]:
    from components.schema import Task

    return [
        Task(
            task_id=f"bench-{name}-{fam}-{v}",
            env=env_name,
            family=fam,
            difficulty=1,
            split="train",
            instruction=f"bench {fam}",
            seed=v,
        )
        for fam in families
        for v in range(2)
    ]


def measure_adapter(name: str, n_steps: int) -> dict[str, Any]:
    """ScienceWorld / MiniWoB++ through their adapters (skipped when they cannot start)."""
    from components.config import EnvConfig
    from components.envs import make_env

    env_cfg = EnvConfig(name=name, max_steps=30)  # type: ignore[arg-type]
    families = list(getattr(getattr(env_cfg, name), "task_names", ()))[:3]
    env = make_env(env_cfg, Path.cwd())
    t0 = time.perf_counter()
    try:
        out = _run_real(env, _adapter_tasks(name, families, name), n_steps, seed=0)
    finally:
        env.close()
    return {**out, "families": families, "wall_seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------- synthetic


def _load_model() -> tuple[Any, Any, dict[str, Any], str]:
    """(model, tokenizer, prompt settings dict, description)."""
    from components.experience.sft import load_meta
    from components.lm.models import load_pretrained_dir

    if (MODEL_DIR / "config.json").exists():
        model, tok = load_pretrained_dir(MODEL_DIR)
        meta = load_meta(MODEL_DIR)
        desc = f"trained experience model from {MODEL_DIR} ({meta.get('tiny_preset') or ''})"
        return model, tok, meta, desc.replace(" ()", "")
    return (*_untrained_model(), f"untrained tiny micro model ({MODEL_DIR} absent)")


def _untrained_model() -> tuple[Any, Any, dict[str, Any]]:
    from components.lm.models import build_tiny_model
    from components.lm.tokenizer import train_tokenizer
    from components.schema import Trajectory, read_jsonl

    texts = []
    for i, traj in enumerate(read_jsonl(Path("data/ingested/trajectories.jsonl"), Trajectory)):
        texts += [traj.initial_state, *(s.next_state for s in traj.steps[:5])]
        if i > 200:
            break
    tok = train_tokenizer(texts, vocab_size=4096)
    model = build_tiny_model("micro", tok)
    meta = {"prompt": {"history_len": 2, "k": 3, "with_reasoning": True}, "n_parameters": None}
    return model, tok, meta


class _TokenCounter:
    """A generate backend that also records prompt/answer token counts and finish reasons."""

    def __init__(self, generator: Any, cfg: Any, temperature: float) -> None:
        self.generator = generator
        self.cfg = cfg
        self.temperature = temperature
        self.prompt_tokens: list[int] = []
        self.new_tokens: list[int] = []
        self.finish: Counter[str] = Counter()
        self.calls = 0

    def __call__(self, prompts: list[list[dict[str, str]]]) -> list[str]:
        from components.lm.generate import render_prompts

        self.calls += 1
        tok = self.generator.tokenizer
        self.prompt_tokens += [
            len(tok(t, add_special_tokens=False)["input_ids"]) for t in render_prompts(tok, prompts)
        ]
        kwargs = {
            "max_new_tokens": self.cfg.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.cfg.top_p,
            "stop": ("</reward>",),
            "batch_size": self.cfg.gen_batch_size,
            "seed": self.cfg.seed + self.calls if self.temperature > 0 else None,
        }
        if hasattr(self.generator, "complete"):  # token counts without re-tokenising
            done = self.generator.complete(prompts, **kwargs)
            self.new_tokens += [c.n_tokens for c in done]
            self.finish.update(c.finish_reason for c in done)
            return [c.text for c in done]
        texts = self.generator.generate(prompts, **kwargs)
        self.new_tokens += [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        return texts


def _mean(xs: list[int]) -> float:
    return round(sum(xs) / len(xs), 1) if xs else 0.0


def measure_synthetic(
    model: Any, tok: Any, meta: dict[str, Any], batch: int, budget_s: float, profile: bool
) -> dict[str, Any]:
    """Steps/s of a full batch of ``batch`` synthetic episodes for about ``budget_s``."""
    from components.buffer import ReplayBuffer, make_embedder
    from components.config import load_config
    from components.experience.dataset import PromptSettings, buffer_retriever
    from components.experience.synthetic_env import RealStateIndex, VectorSyntheticEnv
    from components.lm.generate import Generator
    from components.schema import Task, Trajectory, read_jsonl

    cfg = load_config(profile="cpu")
    scfg = cfg.synthetic.model_copy(update={"gen_batch_size": batch})
    prompt = PromptSettings(**meta["prompt"])
    trajs = list(read_jsonl(Path("data/ingested/trajectories.jsonl"), Trajectory))
    index = RealStateIndex.from_trajectories(t for t in trajs if t.split == "train")
    tasks = [
        t
        for t in read_jsonl(Path("data/tasks/tasks.jsonl"), Task)
        if t.split == "train" and index.initial_state(t.task_id)
    ]
    script: dict[str, list[str]] = {}
    for t in trajs:  # a real action sequence per task (the expert's when there is one)
        if t.split == "train" and (t.policy == "expert" or t.task_id not in script):
            script[t.task_id] = [s.action for s in t.steps]
    retriever = None
    if prompt.k > 0:
        buf = ReplayBuffer.open(
            _buffer_dir(cfg), cfg.buffer, embedder=make_embedder(cfg.buffer), create=False
        )
        retriever = buffer_retriever(buf, env="textworld")
    gen = Generator(model, tok)
    slots = [tasks[i % len(tasks)] for i in range(batch)]

    def make_env(n: int) -> tuple[Any, _TokenCounter, _TokenCounter]:
        generate = _TokenCounter(gen, scfg, scfg.temperature)
        resample = _TokenCounter(gen, scfg, scfg.resample_temperature)
        venv = VectorSyntheticEnv(
            generate, index, cfg=scfg, prompt=prompt, retriever=retriever, resample=resample
        )
        venv.reset(slots[:n])
        return venv, generate, resample

    def actions_for(venv: Any) -> list[str]:
        out = []
        for task, n in zip(venv.tasks, venv.episode_steps, strict=True):
            seq = script.get(task.task_id, [])
            out.append(seq[n] if n < len(seq) else FALLBACK_ACTION)
        return out

    # warm-up (lazy model/index loads) and the optional profile, both outside the timing
    warm, _, _ = make_env(batch if profile else 1)
    table = _profiled(lambda: warm.step(actions_for(warm))) if profile else None
    if not profile:
        warm.step(actions_for(warm))
    venv, generate, resample = make_env(batch)
    calls = 0
    start = time.perf_counter()
    while calls == 0 or time.perf_counter() - start < budget_s:
        venv.step(actions_for(venv))
        venv.restart_finished()
        calls += 1
    wall = time.perf_counter() - start
    m = venv.metrics()
    steps = int(m["steps"])
    step_s = m.get("seconds_step", wall)
    parts = {
        "retrieve": m.get("seconds_retrieve", 0.0),
        "generate": m.get("seconds_generate_step", 0.0),
        "resample": m.get("seconds_resample_step", 0.0),
    }
    parts["other"] = max(0.0, step_s - sum(parts.values()))
    all_new = generate.new_tokens + resample.new_tokens
    out = {
        "batch_size": batch,
        "step_calls": calls,
        "steps": steps,
        "seconds": round(step_s, 2),
        "steps_per_s": round(steps / step_s, 3),
        "valid_steps_per_s": round((steps - m["n_failed_malformed"]) / step_s, 3),
        "malformed_rate": m["malformed_rate"],
        "n_malformed": int(m["n_malformed"]),
        "n_resampled": int(m["n_resampled"]),
        "n_failed_malformed": int(m["n_failed_malformed"]),
        "successes": int(m.get("successes", 0)),
        "seconds_by_phase": {k: round(v, 3) for k, v in parts.items()},
        "share_by_phase": {k: round(v / step_s, 3) for k, v in parts.items()},
        "prompt_tokens_mean": _mean(generate.prompt_tokens),
        "new_tokens_mean": _mean(all_new),
        "new_tokens_per_s": round(
            sum(all_new) / max(1e-9, parts["generate"] + parts["resample"]), 1
        ),
        "finish_reasons": dict(generate.finish + resample.finish),
    }
    if table is not None:
        out["profile_top_ops"] = table
    return out


def _buffer_dir(cfg: Any) -> Path:
    """data/buffer, or (while the pipeline rebuilds it) a copy built from the ingested data."""
    from components.buffer import build_buffer

    if (BUFFER_DIR / "transitions.lance").exists():
        return BUFFER_DIR
    tmp = Path(os.environ.get("BENCH_SYNTH_WORK", "/tmp/dreamgym-bench-synthetic")) / "buffer"
    if not (tmp / "transitions.lance").exists():
        build_buffer(cfg, Path("data/ingested/trajectories.jsonl"), tmp)
    return tmp


def _profiled(fn: Any) -> list[dict[str, Any]]:
    """Run ``fn`` under the torch profiler; the top CPU ops by self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_s": round(e.self_cpu_time_total / 1e6, 3),
            "share": round(e.self_cpu_time_total / total, 3),
        }
        for e in rows
    ]


# ---------------------------------------------------------------------- main


def main() -> dict[str, Any]:
    """Measure real and synthetic envs side by side; write the JSON."""
    import torch

    torch.set_num_threads(THREADS)
    started = time.perf_counter()
    machine = _machine()
    real: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    real["textworld"] = measure_textworld(REAL_STEPS)
    print(f"textworld: {real['textworld']['steps_per_s']} steps/s", flush=True)
    for name, steps in (("scienceworld", REAL_STEPS // 3), ("miniwob", REAL_STEPS // 5)):
        try:
            real[name] = measure_adapter(name, steps)
            print(f"{name}: {real[name]['steps_per_s']} steps/s", flush=True)
        except Exception as err:  # an adapter that cannot start here is reported, not fatal
            skipped[name] = f"{type(err).__name__}: {str(err)[:300]}"
            print(f"{name}: skipped ({skipped[name]})", flush=True)

    model, tok, meta, model_desc = _load_model()
    model.eval()
    from components.lm.models import count_parameters

    synthetic: dict[str, Any] = {}
    for b in BATCH_SIZES:
        synthetic[str(b)] = measure_synthetic(
            model, tok, meta, b, BUDGET_S, profile=PROFILE and b == 8
        )
        print(f"synthetic batch {b}: {synthetic[str(b)]['steps_per_s']} steps/s", flush=True)

    real_sps = {k: v["steps_per_s"] for k, v in real.items()}
    # with resets: what an RL loop gets (a ScienceWorld load costs ~1.5 s; synthetic ~0)
    real_with_resets = {k: v["steps_per_s_with_resets"] for k, v in real.items()}
    synth_sps = {k: v["steps_per_s"] for k, v in synthetic.items()}
    slowest = min(real_sps, key=real_sps.__getitem__)
    best = max(synth_sps, key=synth_sps.__getitem__)
    from components.config import load_config

    scfg = load_config(profile="cpu").synthetic
    result = {
        "real_steps_per_s": real_sps,
        "synthetic_steps_per_s": synth_sps,
        "ratio_vs_slowest_real": round(synth_sps[best] / real_sps[slowest], 4),
        "slowest_real": {"env": slowest, "steps_per_s": real_sps[slowest]},
        "real_steps_per_s_with_resets": real_with_resets,
        "ratio_vs_slowest_real_with_resets": round(
            synth_sps[best] / min(real_with_resets.values()), 4
        ),
        "best_synthetic": {"batch_size": int(best), "steps_per_s": synth_sps[best]},
        "ratio_vs_reference_slow_env": round(synth_sps[best] / REFERENCE_SLOW_ENV, 4),
        "goal": {
            "ratio": GOAL_RATIO,
            "reference_slow_env_steps_per_s": REFERENCE_SLOW_ENV,
            "met": synth_sps[best] >= GOAL_RATIO * real_sps[slowest],
        },
        "real": real,
        "real_skipped": skipped,
        "synthetic": synthetic,
        "model": {
            "source": model_desc,
            "dir": str(MODEL_DIR),
            "parameters": count_parameters(model),
            "prompt": meta["prompt"],
        },
        "settings": {
            "max_new_tokens": scfg.max_new_tokens,
            "temperature": scfg.temperature,
            "resample_temperature": scfg.resample_temperature,
            "budget_seconds_per_batch_size": BUDGET_S,
            "real_steps": REAL_STEPS,
            "torch_threads": THREADS,
            "retrieval": f"{_buffer_dir(load_config(profile='cpu'))} "
            f"({load_config(profile='cpu').buffer.embedder})",
            "actions": "real trajectories of each slot's task (expert first), then 'look'",
        },
        "machine": machine,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {
                k: result[k]
                for k in ("real_steps_per_s", "synthetic_steps_per_s", "ratio_vs_slowest_real")
            }
        ),
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
