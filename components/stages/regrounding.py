"""Sim-to-real by re-grounding: the real-step budget buys experience for the dream.

``rl.s2r_mode: reground`` (train_s2r) spends a seed's capped real steps on rollouts of its
DreamGym policy on real train games (``probe_rollouts``). Those real transitions join the
offline real data the experience model is grounded in (``regrounded_model``: the grounded
model is refit on both; an LLM experience model gets them in its retrieval buffer), and
the policy then continues with RL in the re-grounded dream, where synthetic steps are
free. Why: the dream is wrong where the offline data never went (rooms no recorded
episode reached, containers never opened), and a real step spent there corrects every
later synthetic episode, where a real GRPO round of the same size updates the policy
once on a handful of informative groups.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.io import read_json, swap_dir
from components.schema import Task, Trajectory, read_jsonl, stable_id, write_jsonl

log = logging.getLogger("dreamgym")

PROBE_POLICY = "s2r-probe"  # the probes' Trajectory.policy
REGROUNDED_DIR = "experience"  # the refit grounded model (in the run's checkpoint dir)
__all__ = ["offline_train", "probe_rollouts", "reground", "regrounded_model"]


def reground(
    cfg: Config,
    paths: Paths,
    policy: Any,
    tasks: Sequence[Task],
    algo_cfg: Any,
    *,
    cap: int,
    seed: int,
    out_dir: Path,
) -> tuple[list[Trajectory], Path | None, dict[str, Any]]:
    """S2R's real phase: probes (then, with ``rl.s2r_explore``, walks) under ``cap`` real
    steps, and the model refit on them: (real episodes, its directory, the run's figures)."""
    from components.envs import env_factory

    probes, used = probe_rollouts(
        policy,
        env_factory(cfg.env, paths.root),
        tasks,
        algo_cfg,
        cap=cap,
        batch_size=algo_cfg.tasks_per_iteration * algo_cfg.rollouts_per_task,
        seed=seed,
        out_dir=out_dir,
        passes=cfg.rl.s2r_probe_passes,
    )
    # the policy's own success on real games: the walks below are no policy's episodes
    success = sum(t.success for t in probes) / max(1, len(probes))
    walked_stats: dict[str, int] = {}
    if cfg.rl.s2r_explore:  # the rest of the cap: walks to the map's blank exits
        from components.stages.exploration import explore_rollouts, known_maps

        walks, walked = explore_rollouts(
            known_maps([*offline_train(paths), *probes]),
            env_factory(cfg.env, paths.root),
            tasks,
            cap=cap - used,
            max_steps=cfg.env.max_steps,
            seed=seed,
            out_dir=out_dir,
        )
        walked_stats = {"explore_real_steps": walked, "explore_walks": len(walks)}
        probes, used = [*probes, *walks], used + walked
    figures = {
        "probe_real_steps": used,
        "probe_episodes": len(probes),
        "probe_success": success,
        **walked_stats,
    }
    return probes, regrounded_model(cfg, paths, probes, out_dir), figures


def probe_rollouts(
    policy: Any,
    env_factory: Callable[[], Any],
    tasks: Sequence[Task],
    algo_cfg: Any,
    *,
    cap: int,
    batch_size: int,
    seed: int,
    out_dir: Path,
    passes: int | None = None,
) -> tuple[list[Trajectory], int]:
    """(real trajectories, real steps): ``policy`` on the train tasks, at most ``cap`` steps.

    One episode per task in a seeded order, ``batch_size`` at a time, for ``passes`` passes
    (None: until the cap); an episode the cap cuts is dropped (its last step was never
    taken). Saved in ``out_dir``, so a resumed run reuses them instead of spending real
    steps again.
    """
    from components.agent.rl import seed_everything, seed_int
    from components.agent.rollout import collect_rollouts
    from components.envs.vector import CappedEnvList

    # the policy and its sampling decide every probe: a rerun after the DreamGym policy was
    # retrained (its checkpoint dir outlives a killed run) must not reuse the old probes
    sampling = (algo_cfg.temperature, algo_cfg.max_new_tokens, algo_cfg.max_turns)
    key = stable_id(
        cap, seed, passes, _digest(policy), *sampling, *(t.task_id for t in tasks), n=10
    )
    saved = out_dir / f"probes-{key}.jsonl"
    done = saved.with_suffix(".json")
    if done.exists():
        return list(read_jsonl(saved, Trajectory)), int(read_json(done)["steps"])
    order = list(tasks)
    random.Random(seed_int(algo_cfg.seed, "probe", seed)).shuffle(order)
    env = CappedEnvList(env_factory, budget=cap)
    policy.model.eval()
    probes: list[Trajectory] = []
    start, limit = 0, passes * len(order) if passes is not None else None
    try:
        while env.real_steps < cap and (limit is None or start < limit):
            size = batch_size if limit is None else min(batch_size, limit - start)
            batch = [order[(start + i) % len(order)] for i in range(size)]
            pass_no, start = start // len(order), start + size
            seed_everything(seed_int(algo_cfg.seed, "probe", seed, start))
            before = env.real_steps
            rollouts = collect_rollouts(
                policy,
                env,
                batch,
                temperature=algo_cfg.temperature,
                max_new_tokens=algo_cfg.max_new_tokens,
                max_turns=algo_cfg.max_turns,
            )
            for i, ep in enumerate(rollouts.episodes):
                if ep.env_error is not None:  # cut by the cap (BUDGET_CUT) or an env error
                    continue
                traj = ep.to_trajectory(
                    source="real", policy=PROBE_POLICY, iteration=pass_no, index=start + i
                )
                if traj is not None:
                    probes.append(traj)
            if env.real_steps == before:  # nothing could be stepped: no budget to spend
                break
    finally:
        env.close()
    write_jsonl(saved, probes)
    done.write_text(json.dumps({"steps": env.real_steps, "episodes": len(probes)}))
    log.info(
        "S2R seed %d: %d real probe episodes (%d won), %d real steps of %d",
        seed,
        len(probes),
        sum(t.success for t in probes),
        env.real_steps,
        cap,
    )
    return probes, env.real_steps


def offline_train(paths: Paths) -> list[Trajectory]:
    """The offline real trajectories of the train split (what the grounded model was fit on)."""
    return [
        t
        for t in read_jsonl(paths.trajectories_file, Trajectory)
        if t.split == "train" and t.source == "real"
    ]


def _digest(policy: Any) -> str:
    """A digest of the policy's weights (every tensor of its model, in order)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, tensor in policy.model.state_dict().items():
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype
        digest.update(name.encode())
        digest.update(raw.numpy().tobytes())
    return digest.hexdigest()[:16]


def regrounded_model(
    cfg: Config, paths: Paths, probes: Sequence[Trajectory], out_dir: Path
) -> Path | None:
    """The grounded experience model refit on the offline real train data + ``probes``.

    Written under ``out_dir``; None when the pipeline's model is not the grounded one
    (an LLM experience model is re-grounded through its retrieval buffer instead).
    """
    from components.artifacts import experience_model_dir
    from components.experience.grounded import GroundedModel, is_grounded_dir
    from components.stages.experience import grounded_settings

    base = experience_model_dir(paths, "full")
    if not is_grounded_dir(base):
        return None
    offline = offline_train(paths)
    model = GroundedModel(grounded_settings(cfg, "full"))
    stats = model.fit([*offline, *probes])
    dst = out_dir / REGROUNDED_DIR
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    shutil.copy2(base / "meta.json", tmp / "meta.json")
    swap_dir(tmp, dst)
    log.info(
        "re-grounded the experience model: %d offline + %d probe trajectories, %d transitions",
        len(offline),
        len(probes),
        stats.get("transitions", 0),
    )
    return dst
