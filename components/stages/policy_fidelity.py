"""Stage policy_fidelity: fixed policies on the same train games, dreamt and real.

Each method of ``policy_fidelity.methods`` (its first training seed's policy) plays
``games_per_family`` train games of every task family ``passes`` times with sampled
decoding, once in the synthetic env (the experience model ``full``, fresh: nothing a
DreamGym run dreamt) and once in the real env. ``metrics/policy_fidelity.json`` holds,
per env, each policy's success on both sides per family and the dream's gain of each
later method over the first beside the real gain (components/evaluation/policy_fidelity.py).

Open loop: every dreamt episode's actions are also replayed in the real env, which splits
the dream-real gap into the dream's verdict on its own episodes and closed-loop divergence
(components/evaluation/policy_fidelity.py); ``data/policy_fidelity.jsonl`` keeps every
episode's actions.

Real steps here are evaluation on train games, counted in ``real_steps`` (the replays in
``replay_steps``); no policy trains on them, and test games are never played.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.io import read_json
from components.schema import Task
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")

POLICY_FIDELITY_METRICS = "policy_fidelity.json"
POLICY_FIDELITY_MARKDOWN = "policy_fidelity.md"
EPISODES_FILE = "policy_fidelity.jsonl"


def dream_env(cfg: Config, paths: Paths, namespace: str) -> tuple[Any, Any]:
    """(synthetic vector env of the ``full`` experience model, can-start(task) predicate)."""
    from components.artifacts import experience_model_dir
    from components.experience.grounded import is_grounded_dir

    mdir = experience_model_dir(paths, "full")
    if not mdir.exists():
        raise FileNotFoundError(f"{mdir} missing: run `dreamgym train-experience-model`")
    if is_grounded_dir(mdir):
        from components.experience.grounded import GroundedModel
        from components.experience.grounded_env import GroundedVectorEnv

        model = GroundedModel.load(mdir)
        venv = GroundedVectorEnv(
            model, max_steps=cfg.synthetic.max_steps, env_name=cfg.env.name, namespace=namespace
        )
        return venv, lambda t: model.initial_state(t.task_id) is not None
    from components.experience.synthetic_env import RealStateIndex
    from components.schema import Trajectory, read_jsonl
    from components.stages.experience import llm_dream_env

    index = RealStateIndex.from_trajectories(
        t for t in read_jsonl(paths.trajectories_file, Trajectory) if t.split == "train"
    )
    venv = llm_dream_env(cfg, paths, mdir, index, namespace)
    return venv, lambda t: index.initial_state(t.task_id) is not None


def play(
    policy: Any,
    venv: Any,
    games: Sequence[Task],
    *,
    passes: int,
    chunk: int,
    seed: int,
    max_new_tokens: int,
) -> list[dict[str, Any]]:
    """Every game ``passes`` times, ``chunk`` episodes at a time, sampled: one row each."""
    import torch

    from components.agent.rollout import collect_rollouts
    from components.progress import progress_bar

    rows: list[dict[str, Any]] = []
    bar = progress_bar(total=passes * len(games), desc="policy fidelity", unit="episode")
    for p in range(passes):
        torch.manual_seed(seed + 1000 * p)  # both sides sample from the same seeds
        for i in range(0, len(games), chunk):
            part = list(games[i : i + chunk])
            batch = collect_rollouts(
                policy, venv, part, temperature=1.0, max_new_tokens=max_new_tokens
            )
            for ep in batch.episodes:
                rows.append(
                    {
                        "task_id": ep.task.task_id,
                        "family": ep.task.family,
                        "pass": p,
                        "won": bool(ep.won),
                        "steps": len(ep.turns),
                        "actions": [t.act.action for t in ep.turns],
                        "env_error": ep.env_error,  # a crash, counted as a loss: said
                    }
                )
            bar.update(len(part))
    bar.close()
    return rows


def replay(
    venv: Any, games: Mapping[str, Task], rows: Sequence[dict[str, Any]], chunk: int
) -> None:
    """Each row's actions replayed open loop in ``venv`` (the real env), ``chunk`` episodes
    at a time: sets the row's ``replay_won``."""
    from components.envs.base import step_won
    from components.evaluation.policy_fidelity import REPLAY_WON
    from components.progress import progress_bar

    bar = progress_bar(total=len(rows), desc="open-loop replay", unit="episode")
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        venv.reset([games[r["task_id"]] for r in part])
        won = [False] * len(part)
        for t in range(max(len(r["actions"]) for r in part)):
            live = venv.active
            actions = [
                r["actions"][t] if live[s] and t < len(r["actions"]) else None
                for s, r in enumerate(part)
            ]
            for s, out in enumerate(venv.step(actions)):
                won[s] = won[s] or (out is not None and step_won(out[4], float(out[1])))
        for r, w in zip(part, won, strict=True):
            r[REPLAY_WON] = w
        bar.update(len(part))
    bar.close()


def policy_fidelity(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage policy_fidelity: dream vs real success of fixed policies -> metrics file."""
    from components.agent.loading import load_policy
    from components.agent.table1 import keep_other_envs
    from components.artifacts import policy_dir
    from components.envs import env_factory
    from components.envs.vector import EnvList
    from components.evaluation.policy_fidelity import (
        DREAM,
        REAL,
        markdown,
        markdown_all,
        select_games,
        summarise,
    )
    from components.stages.data import load_tasks
    from components.tracking import run_provenance, stage_run

    pf = cfg.policy_fidelity
    # one policy per method: the first seed it trained (PPO's may differ from agent.seeds)
    seeds = {method: cfg.seeds_of(method)[0] for method in pf.methods}
    rows: list[dict[str, Any]] = []
    real_steps = replay_steps = 0
    data = {"tasks": paths.tasks_file}
    with stage_run(
        "policy_fidelity", "evaluation", cfg, ("policy_fidelity",), paths.root, data
    ) as run:
        venv_dream, startable = dream_env(cfg, paths, namespace="policy-fidelity")
        games = [
            g for g in select_games(load_tasks(paths), pf.games_per_family, pf.seed) if startable(g)
        ]
        if not games:
            raise ValueError("no train game the experience model can start: run collect first")
        by_id = {g.task_id: g for g in games}
        real = EnvList(factory=env_factory(cfg.env, paths.root))
        try:
            for method in pf.methods:
                policy = load_policy(policy_dir(paths, method, seeds[method]), cfg.agent)
                for side, venv, chunk in (
                    (DREAM, venv_dream, len(games)),
                    (REAL, real, cfg.agent.eval.parallel_envs),
                ):
                    log.info(
                        "policy fidelity: %s in the %s env, %d games", method, side, len(games)
                    )
                    played = play(
                        policy,
                        venv,
                        games,
                        passes=pf.passes,
                        chunk=chunk,
                        seed=pf.seed,
                        max_new_tokens=cfg.agent.eval.max_new_tokens,
                    )
                    rows += [{**r, "method": method, "side": side} for r in played]
                dreamt = [r for r in rows if r["method"] == method and r["side"] == DREAM]
                log.info("policy fidelity: %s's dreamt episodes replayed in the real env", method)
                before = real.real_steps
                replay(real, by_id, dreamt, chunk=cfg.agent.eval.parallel_envs)
                replay_steps += real.real_steps - before
            real_steps = real.real_steps - replay_steps
        finally:
            real.close()
        doc = summarise(rows, pf.methods)
        doc |= {
            "games": len(games),
            "passes": pf.passes,
            "policy_seeds": seeds,
            "real_steps": real_steps,
            "replay_steps": replay_steps,  # open loop: the dreamt episodes' actions, real env
            "max_steps": {DREAM: cfg.synthetic.max_steps, REAL: cfg.env.max_steps},
        }
        run.log_metrics(_flat(doc))
        run.log_dict(doc, "policy_fidelity/policy_fidelity.json")
    doc["_provenance"] = run_provenance(paths.root, cfg.profile, cfg.env.name)
    table = _merge(paths.metrics / POLICY_FIDELITY_METRICS, cfg.env.name, doc, keep_other_envs)
    _write_rows(paths.data / EPISODES_FILE, rows)
    write_json(paths.metrics / POLICY_FIDELITY_METRICS, table)
    (paths.metrics / POLICY_FIDELITY_MARKDOWN).write_text(markdown_all(table), encoding="utf-8")
    log.info("policy fidelity:\n%s", markdown(cfg.env.name, doc))
    return _flat(doc)


def _flat(doc: dict[str, Any]) -> dict[str, float]:
    """The figure's headline numbers as flat MLflow metric keys."""
    from components.evaluation.policy_fidelity import OPEN_LOOP, SIDES

    out = {f"{m}.{side}": f[side]["success"] for m, f in doc["methods"].items() for side in SIDES}
    out |= {f"{m}.family_mae": f["family_mae"] for m, f in doc["methods"].items()}
    out |= {f"gain.{g}.error": v["error"] for g, v in doc["gains"].items()}
    for m, f in doc["methods"].items():
        if OPEN_LOOP in f:
            loop = f[OPEN_LOOP]
            out[f"{m}.{OPEN_LOOP}"] = loop["success"]["success"]
            out[f"{m}.{OPEN_LOOP}.verdict_error"] = loop["verdict_error"]["diff"]
            out[f"{m}.{OPEN_LOOP}.closed_loop_divergence"] = loop["closed_loop_divergence"]["diff"]
    return out | numbers(doc)


def _merge(path: Path, env: str, doc: dict[str, Any], keep: Any) -> dict[str, Any]:
    """``{env: doc}`` with the other envs' figures of ``path`` kept (dvc.yaml: persist)."""
    # a damaged file stops the stage (never drop the other envs' figures silently)
    old = read_json(path) if path.exists() else {}
    prov = doc.pop("_provenance")
    return keep({env: doc, "_provenance": prov}, old, env)


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Every episode of the stage, one JSON line each, written atomically."""
    from components.io import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
