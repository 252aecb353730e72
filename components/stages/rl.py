"""Agent RL stages: GRPO / PPO in the real env, in DreamGym's synthetic env, and sim-to-real.

    train_rl_real   models/policy/sft            -> real train-split games      -> <algo>_real
    train_dreamgym  models/policy/sft            -> synthetic env only (0 real) -> dreamgym_<algo>
    train_s2r       models/policy/dreamgym_<algo> -> real games, capped          -> s2r_<algo>

All three run ``components.agent.train.train_rl`` (rounds of batched rollouts + one
GRPO/PPO update) with the batch shape of ``rl.<algo>`` (tasks_per_iteration x
rollouts_per_task), so a real round and a synthetic round train on the same number of
episodes. Each stage saves ``models/policy/<method>`` (registered in MLflow as ``policy``,
aliases ``candidate`` and the method), writes ``metrics/agent/<method>.json`` and the
per-round history ``metrics/history/<method>.jsonl``, and logs every round to MLflow.
Training state lives in ``models/checkpoints/policy/<method>`` (outside the DVC outputs,
which DVC deletes before a run), so a killed run resumes at its last checkpoint; a run
that finishes removes it.

DreamGym round i: the curriculum picks the task batch (round 0: real tasks; later: the
highest-reward-variance tasks seed generated variants, at most floor(lambda x batch) per
batch; ``ablation.no_task_generation`` keeps real tasks only) -> rollouts in the synthetic
env driven by ``models/experience/full`` -> policy update -> the round's synthetic
transitions are appended to the stage's fork of the seed buffer and tagged ``iter-<i>``
(not under ``ablation.no_replay``). The experience model retrieves from that growing fork.
No real env is ever created; the real-step count is asserted to be 0.

Sim-to-real caps its real steps EXACTLY at floor(rl.s2r_real_fraction x the real steps
<algo>_real used): ``CappedEnvList`` refuses the steps past the cap, and the episodes it
cuts are not trained on (they never reached their end).
Held-out test tasks are never trained on: every task pool is the train split.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.agent.rollout import ENV_ERROR, EnvList, StepTuple
from components.config import Config, Paths, RLAlgoConfig
from components.schema import Task, Trajectory, read_jsonl, write_jsonl
from components.stages.agent import AGENT_DIR, SFT, _register, checkpoint_dir, policy_dir
from components.stages.common import numbers, write_json

if TYPE_CHECKING:
    from components.agent.policy_model import PolicyModel
    from components.agent.rollout import RolloutBatch

log = logging.getLogger("dreamgym")

GRPO, PPO = "grpo", "ppo"
ALGOS = (GRPO, PPO)
TRAIN_SPLIT = "train"
HISTORY_DIR = "history"  # metrics/history/<method>.jsonl
SYNTHETIC_DIR = "synthetic"  # data/synthetic/dreamgym_<algo>.jsonl
COEVOLVED_DIR = "coevolved"  # data/coevolved/dreamgym_<algo> (fork of data/buffer)
ROUNDS_DIR = "rounds"  # per-round curriculum state + metrics (in the checkpoint dir)
WORK_BUFFER_DIR = "buffer"  # the co-evolving buffer while training (in the checkpoint dir)
BUDGET_CUT = "real-step budget spent"  # ENV_ERROR of episodes cut by CappedEnvList
_SECTIONS = ("agent", "rl", "env")


def real_method(algo: str) -> str:
    """Table-1 name of RL in the real env."""
    return f"{_checked(algo)}_real"


def dreamgym_method(algo: str) -> str:
    """Table-1 name of RL in the synthetic env."""
    return f"dreamgym_{_checked(algo)}"


def s2r_method(algo: str) -> str:
    """Table-1 name of sim-to-real."""
    return f"s2r_{_checked(algo)}"


def _checked(algo: str) -> str:
    if algo not in ALGOS:
        raise ValueError(f"unknown RL algorithm {algo!r}; known: {ALGOS}")
    return algo


def history_file(paths: Paths, method: str) -> Path:
    """The per-round training history of a method, one JSON row per round."""
    return paths.metrics / HISTORY_DIR / f"{method}.jsonl"


def history_plot_file(paths: Paths, method: str) -> Path:
    """The same history as one JSON array: the DVC plot (DVC cannot parse JSON Lines)."""
    return paths.metrics / HISTORY_DIR / f"{method}.json"


def agent_metrics_file(paths: Paths, method: str) -> Path:
    """The training summary of a method."""
    return paths.metrics / AGENT_DIR / f"{method}.json"


def synthetic_file(paths: Paths, algo: str) -> Path:
    """The synthetic trajectories a DreamGym run trained on."""
    return paths.data / SYNTHETIC_DIR / f"{dreamgym_method(algo)}.jsonl"


def snapshots_dir(paths: Paths, method: str) -> Path:
    """Every round's policy weights of a run (``theorem1.snapshots``), for the theorem1 stage."""
    return paths.root / "models" / "snapshots" / method


def coevolved_dir(paths: Paths, algo: str) -> Path:
    """The co-evolved replay buffer of a DreamGym run."""
    return paths.data / COEVOLVED_DIR / dreamgym_method(algo)


class CappedEnvList(EnvList):
    """An ``EnvList`` that takes at most ``budget`` real steps, then cuts the episodes.

    A slot whose step would exceed the budget is not stepped: it ends with
    ``info[ENV_ERROR] = BUDGET_CUT`` (so the learners skip the unfinished episode).
    """

    def __init__(self, factory: Callable[[], Any], budget: int) -> None:
        super().__init__(factory=factory)
        self.budget = budget

    def step(self, actions: Sequence[str | None]) -> list[StepTuple | None]:
        """Step live slots while budget remains; the rest are cut, unstepped."""
        allowed, cut = list(actions), []
        left = self.budget - self.real_steps
        for s, action in enumerate(actions):
            if action is None or not self._live[s]:
                continue
            if left > 0:
                left -= 1
            else:
                allowed[s] = None
                cut.append(s)
        out = super().step(allowed)
        for s in cut:
            self._live[s] = False
            out[s] = ("", 0.0, True, False, {ENV_ERROR: BUDGET_CUT})
        return out


# ----------------------------------------------------------------------------- shared


def _algo_config(cfg: Config, algo: str) -> RLAlgoConfig:
    return getattr(cfg.rl, _checked(algo))


def load_policy(cfg: Config, init_dir: Path) -> PolicyModel:
    """A saved policy to continue from (fresh LoRA adapters when ``agent.lora``)."""
    from components.agent.policy_model import LoraSettings, PolicyModel

    if not (init_dir / "config.json").exists():
        raise FileNotFoundError(f"no policy under {init_dir}: train it first")
    policy = PolicyModel.from_dir(init_dir)
    if cfg.agent.lora:
        policy.add_lora(LoraSettings(r=cfg.agent.lora_r, alpha=cfg.agent.lora_alpha))
    return policy


def _threads(model: Any) -> int | None:
    """1 torch thread for a small model on CPU (faster under contention), else unchanged."""
    from components.lm.generate import SMALL_MODEL_PARAMS

    on_cpu = next(model.parameters()).device.type == "cpu"
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS
    return 1 if on_cpu and small else None


def _train_tasks(paths: Paths) -> list[Task]:
    """The real train-split tasks (never validation or test)."""
    from components.stages.data import load_tasks

    tasks = [t for t in load_tasks(paths) if t.split == TRAIN_SPLIT and not t.generated]
    if not tasks:
        raise ValueError(f"{paths.tasks_file} has no train-split task")
    return tasks


def _resume_point(out_dir: Path, algo_cfg: RLAlgoConfig, extra: dict[str, Any]) -> tuple[int, int]:
    """(rounds done, real steps used) of the run ``train_rl`` will resume; (0, 0) if none.

    Uses the same fingerprint as train_rl, so checkpoints of another run are wiped here.
    """
    from components.agent import checkpoint
    from components.agent.train import CHECKPOINT_DIR, fingerprint_of

    last = checkpoint.prepare(out_dir / CHECKPOINT_DIR, fingerprint_of(algo_cfg, extra))
    if last is None:
        return 0, 0
    state = checkpoint.load(last)
    return int(state["iteration"]), int(state["real_steps"])


def _publish_policy(src: Path, dst: Path, meta: dict[str, Any]) -> None:
    """Copy the trained policy to its DVC output with its metadata, atomically."""
    from components.agent.baselines import META_FILE

    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def _publish_snapshots(out_dir: Path, dst: Path, method: str, init: str) -> None:
    """Copy the run's per-round snapshots to their DVC output, with an index."""
    from components.agent.train import SNAPSHOT_DIR

    src = out_dir / SNAPSHOT_DIR
    shutil.rmtree(dst, ignore_errors=True)
    if src.exists():
        shutil.copytree(src, dst)
    else:  # snapshots off: an empty output, so the DVC stage still has it
        dst.mkdir(parents=True)
    rounds = sorted(int(f.stem.split("-")[1]) for f in dst.glob("iter-*.pt"))
    index = {"method": method, "init": init, "rounds": rounds}
    write_json(dst / "index.json", index)


def _write_history(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def read_history(path: Path) -> list[dict[str, Any]]:
    """The per-round rows of a history file ([] if there is none)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _run_rl(
    cfg: Config,
    paths: Paths,
    *,
    stage: str,
    method: str,
    algo: str,
    algo_cfg: RLAlgoConfig,
    init: str,
    env: Any,
    tasks: Any,
    fingerprint: dict[str, Any],
    data: dict[str, Path],
    sections: tuple[str, ...] = _SECTIONS,
    on_rollouts: Callable[[Any, int, RolloutBatch], None] | None = None,
    finish: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None,
    meta_extra: dict[str, Any] | None = None,
    snapshots: bool | None = None,
) -> dict[str, Any]:
    """Train, then save/register the policy and write its metrics and history.

    ``on_rollouts(run, iteration, batch)`` sees each round's episodes (with the MLflow run
    to log to). ``finish(summary, run)`` (inside the MLflow run, after training) returns extra
    metrics for the summary and may rewrite the history file before it is published.
    ``snapshots``: None = not kept; True/False = keep every round's weights or not, and
    publish ``snapshots_dir`` either way (empty when False: it is a DVC output).
    """
    from components.agent.train import HISTORY_FILE, POLICY_DIR, train_rl
    from components.lm.generate import torch_threads
    from components.tracking import stage_run

    start = time.perf_counter()
    out_dir = checkpoint_dir(paths, method)
    init_dir = policy_dir(paths, init)
    policy = load_policy(cfg, init_dir)
    threads = _threads(policy.model)
    with (
        torch_threads(threads),
        stage_run(stage, "agent", cfg, sections, paths.root, data) as run,
    ):
        run.set_tags({"method": method, "algorithm": algo, "init": init})
        run.log_params({"torch_threads": threads, "real_step_cap": algo_cfg.max_real_steps})
        summary = train_rl(
            policy,
            env,
            tasks,
            algo_cfg,
            out_dir,
            lambda metrics, step: run.log_metrics(metrics, step=step),
            on_rollouts=(lambda i, b: on_rollouts(run, i, b)) if on_rollouts else None,
            fingerprint=fingerprint,
            snapshots=bool(snapshots),
        )
        extra = finish(summary, run) if finish is not None else {}
        history = read_history(out_dir / HISTORY_FILE)
        metrics: dict[str, Any] = {
            **numbers(summary),
            "synthetic_steps": 0,
            **extra,
            "wall_seconds": round(time.perf_counter() - start, 2),
        }
        meta = {
            "method": method,
            "algorithm": algo,
            "init": init,
            "base_model": cfg.agent.model,
            "real_steps": int(metrics["real_steps"]),
            "synthetic_steps": int(metrics["synthetic_steps"]),
            "iterations": int(summary["iterations"]),
            **(meta_extra or {}),
        }
        out = policy_dir(paths, method)
        _publish_policy(out_dir / POLICY_DIR, out, meta)
        _write_history(history_file(paths, method), history)
        write_json(history_plot_file(paths, method), history)
        if snapshots is not None:
            _publish_snapshots(out_dir, snapshots_dir(paths, method), method, init)
        run.log_metrics({f"final.{k}": v for k, v in metrics.items()})
        run.log_artifact(history_file(paths, method), "history")
        version = _register(run, cfg, out, method, {"init": init, "real_steps": meta["real_steps"]})
    write_json(agent_metrics_file(paths, method), numbers(metrics))
    shutil.rmtree(out_dir, ignore_errors=True)  # finished: the next run starts fresh
    log.info("%s trained: %s", method, json.dumps(numbers(metrics), sort_keys=True))
    return {**metrics, "registered_version": version, "model_dir": str(out)}


# ----------------------------------------------------------------------------- stages


def train_rl_real(cfg: Config, paths: Paths, algo: str) -> dict[str, Any]:
    """Stage train_rl_real@<algo>: RL from the SFT policy on real train-split games."""
    from components.envs import make_env
    from components.tracking import dvc_md5

    method = real_method(algo)
    algo_cfg = _algo_config(cfg, algo)
    tasks = _train_tasks(paths)
    sft_dir = policy_dir(paths, SFT)
    fingerprint = {
        "method": method,
        "init": dvc_md5(sft_dir) if sft_dir.exists() else "missing",
        "env": cfg.env.model_dump(mode="json"),
        "tasks": sorted(t.task_id for t in tasks),
    }
    return _run_rl(
        cfg,
        paths,
        stage=f"train_rl_real@{algo}",
        method=method,
        algo=algo,
        algo_cfg=algo_cfg,
        init=SFT,
        env=lambda: make_env(cfg.env, paths.root),
        tasks=tasks,
        fingerprint=fingerprint,
        data={"tasks": paths.tasks_file, "init_policy": sft_dir},
    )


def train_s2r(cfg: Config, paths: Paths, algo: str) -> dict[str, Any]:
    """Stage train_s2r@<algo>: the DreamGym policy continues in the real env, capped.

    Cap = floor(rl.s2r_real_fraction x real steps of <algo>_real), read from its metrics.
    """
    from components.envs import make_env
    from components.tracking import dvc_md5

    method, init = s2r_method(algo), dreamgym_method(algo)
    reference = agent_metrics_file(paths, real_method(algo))
    if not reference.exists():
        raise FileNotFoundError(f"{reference} missing: run `dreamgym train-rl-real --algo {algo}`")
    reference_steps = int(json.loads(reference.read_text(encoding="utf-8"))["real_steps"])
    cap = math.floor(cfg.rl.s2r_real_fraction * reference_steps)
    algo_cfg = _algo_config(cfg, algo).model_copy(update={"max_real_steps": cap})
    tasks = _train_tasks(paths)
    init_dir = policy_dir(paths, init)
    fingerprint = {
        "method": method,
        "init": dvc_md5(init_dir) if init_dir.exists() else "missing",
        "env": cfg.env.model_dump(mode="json"),
        "tasks": sorted(t.task_id for t in tasks),
        "real_step_cap": cap,
    }
    _, used = _resume_point(checkpoint_dir(paths, method), algo_cfg, fingerprint)
    venv = CappedEnvList(lambda: make_env(cfg.env, paths.root), budget=cap - used)
    log.info(
        "S2R %s: real-step cap %d (%.3g x %d)", algo, cap, cfg.rl.s2r_real_fraction, reference_steps
    )

    def finish(summary: dict[str, Any], run: Any) -> dict[str, Any]:
        if summary["real_steps"] > cap:  # CappedEnvList makes this impossible
            raise AssertionError(f"S2R used {summary['real_steps']} real steps > cap {cap}")
        return {"real_step_cap": cap, "reference_real_steps": reference_steps}

    try:
        return _run_rl(
            cfg,
            paths,
            stage=f"train_s2r@{algo}",
            method=method,
            algo=algo,
            algo_cfg=algo_cfg,
            init=init,
            env=venv,
            tasks=tasks,
            fingerprint=fingerprint,
            data={"tasks": paths.tasks_file, "init_policy": init_dir, "reference": reference},
            finish=finish,
            meta_extra={"real_step_cap": cap},
        )
    finally:
        venv.close()


def _experience_backend(cfg: Config, paths: Paths, exp_dir: Path) -> Any:
    """The experience model: in this process, or behind an OpenAI-compatible server."""
    from components.lm.serving import OPENAI, experience_backend

    if cfg.serving.backend == OPENAI:  # vLLM serves models/experience/full under its name
        return experience_backend(cfg.serving, paths.root)
    from components.lm.generate import Generator
    from components.lm.models import load_pretrained_dir

    model, tokenizer = load_pretrained_dir(exp_dir)  # the stage's DVC dep, whatever serving says
    return Generator(model, tokenizer)


def train_dreamgym(cfg: Config, paths: Paths, algo: str) -> dict[str, Any]:
    """Stage train_dreamgym@<algo>: RL from the SFT policy in the synthetic env only."""
    from components.agent.train import HISTORY_FILE
    from components.buffer import SEED_TAG
    from components.curriculum import Curriculum, Rollout
    from components.experience.coevolution import (
        append_iteration,
        coevolution_enabled,
        fork_seed_buffer,
        iteration_tag,
    )
    from components.experience.sft import load_meta
    from components.experience.synthetic_env import RealStateIndex, VectorSyntheticEnv
    from components.experience.task_generation import TASK_STOP
    from components.stages.experience import model_dir
    from components.tracking import dvc_md5

    method = dreamgym_method(algo)
    algo_cfg = _algo_config(cfg, algo)
    out_dir = checkpoint_dir(paths, method)
    exp_dir, sft_dir, seed_buffer = model_dir(paths, "full"), policy_dir(paths, SFT), paths.buffer
    if not paths.trajectories_file.exists():
        raise FileNotFoundError(f"{paths.trajectories_file} missing: run `dreamgym ingest`")
    for needed, hint in ((exp_dir, "train-experience-model"), (seed_buffer, "build-buffer")):
        if not needed.exists():
            raise FileNotFoundError(f"{needed} missing: run `dreamgym {hint}`")
    # initial states and admissible actions from real TRAIN episodes only
    index = RealStateIndex.from_trajectories(
        t for t in read_jsonl(paths.trajectories_file, Trajectory) if t.split == TRAIN_SPLIT
    )
    tasks = [t for t in _train_tasks(paths) if index.initial_state(t.task_id) is not None]
    if not tasks:
        raise ValueError("no train task has a recorded initial state to start synthetic episodes")
    coevolve = coevolution_enabled(cfg.ablation)
    fingerprint = {
        "method": method,
        "init": dvc_md5(sft_dir) if sft_dir.exists() else "missing",
        "experience_model": dvc_md5(exp_dir),
        "seed_buffer": dvc_md5(seed_buffer),
        "synthetic": cfg.synthetic.model_dump(mode="json"),
        "curriculum": cfg.curriculum.model_dump(mode="json"),
        "ablation": cfg.ablation.model_dump(mode="json"),
        "tasks": sorted(t.task_id for t in tasks),
    }
    resumed_at, _ = _resume_point(out_dir, algo_cfg, fingerprint)
    rounds_dir, synth_dir = out_dir / ROUNDS_DIR, out_dir / SYNTHETIC_DIR
    if resumed_at == 0:  # a fresh run: nothing of an older one may leak in
        for stale in (rounds_dir, synth_dir, out_dir / WORK_BUFFER_DIR):
            shutil.rmtree(stale, ignore_errors=True)
    rounds_dir.mkdir(parents=True, exist_ok=True)
    synth_dir.mkdir(parents=True, exist_ok=True)
    buffer = fork_seed_buffer(seed_buffer, out_dir / WORK_BUFFER_DIR, cfg.buffer)
    if resumed_at > 0 and coevolve:  # drop what the killed round appended after its checkpoint
        buffer.restore(iteration_tag(resumed_at - 1))

    backend = _experience_backend(cfg, paths, exp_dir)
    venv = VectorSyntheticEnv.from_config(
        cfg, backend, index, buffer=buffer, meta=load_meta(exp_dir), namespace=method
    )
    # the batch shape is rl.<algo>'s (as in the real-env run); the curriculum picks the tasks
    cur_cfg = cfg.curriculum.model_copy(update={"batch_size": algo_cfg.tasks_per_iteration})
    progress = {"iteration": 0}  # seeds the variant sampling of each round

    def generate_variants(prompts: list[list[dict[str, str]]]) -> list[str]:
        return backend.generate(
            prompts,
            max_new_tokens=cur_cfg.task_max_new_tokens,
            temperature=cur_cfg.task_temperature,
            stop=(TASK_STOP,),
            batch_size=cfg.synthetic.gen_batch_size,
            seed=cur_cfg.seed + progress["iteration"],
        )

    curriculum = Curriculum(
        tasks,
        cur_cfg,
        generate_fn=generate_variants,
        task_generation=not cfg.ablation.no_task_generation,
        group_by="task" if algo == GRPO else "cluster",  # PPO has no task groups
        embedder=buffer.embedder if algo == PPO else None,
    )
    last_rollouts: dict[int, list[Rollout]] = {}
    round_metrics: dict[int, dict[str, float]] = {}

    def round_file(iteration: int) -> Path:
        return rounds_dir / f"{iteration:05d}.json"

    def tasks_for(iteration: int) -> list[Task]:
        progress["iteration"] = iteration
        if iteration == 0:
            batch = curriculum.first_batch()
        else:
            if iteration - 1 not in last_rollouts:  # resumed: restore the curriculum
                saved = json.loads(round_file(iteration - 1).read_text(encoding="utf-8"))
                curriculum.generated = [Task(**t) for t in saved["generated"]]
                curriculum.seed_ids = set(saved["seed_ids"])
                last_rollouts[iteration - 1] = [Rollout(*r) for r in saved["rollouts"]]
            batch = curriculum.next_batch(last_rollouts.pop(iteration - 1), iteration)
        if any(t.split != TRAIN_SPLIT for t in batch.tasks):
            raise AssertionError("a non-train task reached the DreamGym batch")
        round_metrics[iteration] = {f"curriculum.{k}": v for k, v in batch.metrics.items()}
        return batch.tasks

    def on_rollouts(run: Any, iteration: int, batch: RolloutBatch) -> None:
        if batch.real_steps:
            raise AssertionError(f"DreamGym round {iteration} took {batch.real_steps} real steps")
        trajs = venv.trajectories(
            policy=method, iteration=iteration, checkpoint=f"round-{iteration}"
        )
        write_jsonl(synth_dir / f"{iteration:05d}.jsonl", trajs)
        extra = {**round_metrics.pop(iteration, {})}
        extra.update({f"synthetic.{k}": v for k, v in venv.metrics(reset=True).items()})
        if coevolve:
            added = append_iteration(buffer, trajs, iteration, overwrite_tag=True)
            extra.update({f"buffer.{k}": v for k, v in added.metrics().items()})
        rollouts = [Rollout(e.task.task_id, e.reward) for e in batch.episodes]
        last_rollouts[iteration] = rollouts
        state = {
            "rollouts": [list(r) for r in rollouts],
            "generated": [t.model_dump(mode="json") for t in curriculum.generated],
            "seed_ids": sorted(curriculum.seed_ids),
            "metrics": extra,
        }
        round_file(iteration).write_text(json.dumps(state), encoding="utf-8")
        run.log_metrics(extra, step=iteration + 1)

    def finish(summary: dict[str, Any], run: Any) -> dict[str, Any]:
        from components.buffer import fork_buffer

        if summary["real_steps"] != 0:
            raise AssertionError(f"DreamGym used {summary['real_steps']} real steps")
        done = range(int(summary["iterations"]))
        extras = [json.loads(round_file(i).read_text(encoding="utf-8"))["metrics"] for i in done]
        # the published history: train_rl's rows with the round's curriculum/env/buffer stats
        history_path = out_dir / HISTORY_FILE
        rows = read_history(history_path)
        _write_history(history_path, [{**row, **x} for row, x in zip(rows, extras, strict=True)])
        trajs = [t for i in done for t in read_jsonl(synth_dir / f"{i:05d}.jsonl", Trajectory)]
        write_jsonl(synthetic_file(paths, algo), trajs)
        fork_buffer(out_dir / WORK_BUFFER_DIR, coevolved_dir(paths, algo), overwrite=True)
        stats = buffer.stats()
        # env steps asked for; those whose answer stayed malformed end the episode unrecorded
        attempted = sum(x.get("synthetic.steps", 0.0) for x in extras)
        answers = attempted + sum(x.get("synthetic.n_resampled", 0.0) for x in extras)
        malformed = sum(x.get("synthetic.n_malformed", 0.0) for x in extras)
        failed = sum(x.get("synthetic.n_failed_malformed", 0.0) for x in extras)
        return {
            "synthetic_steps": sum(len(t.steps) for t in trajs),
            "synthetic_steps_failed_malformed": int(failed),
            "synthetic_trajectories": len(trajs),
            "experience_malformed_rate": round(malformed / answers, 4) if answers else 0.0,
            "generated_tasks": len(curriculum.generated),
            "buffer_rows": int(stats["rows"]),
            "buffer_rows_synthetic": int(stats["rows_synthetic"]),
            "buffer_tags": len([t for t in buffer.tags() if t != SEED_TAG]),
            "coevolution": int(coevolve),
            "task_generation": int(curriculum.task_generation),
        }

    sections = (*_SECTIONS, "synthetic", "curriculum", "ablation", "buffer")
    data = {
        "tasks": paths.tasks_file,
        "trajectories": paths.trajectories_file,
        "init_policy": sft_dir,
        "experience_model": exp_dir,
        "seed_buffer": seed_buffer,
    }
    return _run_rl(
        cfg,
        paths,
        stage=f"train_dreamgym@{algo}",
        method=method,
        algo=algo,
        algo_cfg=algo_cfg,
        init=SFT,
        env=venv,
        tasks=tasks_for,
        fingerprint=fingerprint,
        data=data,
        sections=sections,
        on_rollouts=on_rollouts,
        finish=finish,
        meta_extra={"experience_model": "full", "coevolution": coevolve},
        snapshots=cfg.theorem1.snapshots,
    )
