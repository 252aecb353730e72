"""Agent stages: the SFT and DPO baselines, held-out evaluation of any policy, Table 1.

``train_sft_baseline`` clones successful train-split trajectories; ``train_dpo_baseline``
continues from the SFT policy on preference pairs of the same offline data. Both save to
``models/policy/<method>`` and register the policy as ``policy`` (aliases ``candidate``
and the method name). ``evaluate_policy`` runs a saved policy on the held-out real test
tasks and writes ``metrics/eval/<method>.json``; ``build_table1`` gathers those files into
``metrics/table1.json`` and a markdown table. Heavy imports stay inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.schema import Trajectory, read_jsonl
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")

REGISTERED_MODEL = "policy"
CANDIDATE_ALIAS = "candidate"
SFT = "sft"
DPO = "dpo"
EVAL_DIR = "eval"  # metrics/eval/<method>.json
AGENT_DIR = "agent"  # metrics/agent/<method>.json (training)
TABLE1_METRICS = "table1.json"
TABLE1_MARKDOWN = "table1.md"
# budgets, logging and evaluation knobs do not change the trained weights
_NOT_IN_FINGERPRINT = {
    "eval": True,
    "sft": {"max_train_minutes", "logging_steps", "save_steps", "eval_loss_examples"},
    "dpo": {"max_train_minutes", "logging_steps", "save_steps"},
}


def policy_dir(paths: Paths, method: str) -> Path:
    """Where the policy of a method is saved (a DVC output)."""
    return paths.root / "models" / "policy" / method


def checkpoint_dir(paths: Paths, method: str) -> Path:
    """Training checkpoints of a method (outside the DVC output, so a re-run can resume)."""
    return paths.root / "models" / "checkpoints" / "policy" / method


def eval_file(paths: Paths, method: str) -> Path:
    """The evaluation metrics of a method on the held-out test tasks."""
    return paths.metrics / EVAL_DIR / f"{method}.json"


def _load_trajectories(paths: Paths) -> list[Trajectory]:
    if not paths.trajectories_file.exists():
        raise FileNotFoundError(f"{paths.trajectories_file} missing: run `dreamgym ingest`")
    return list(read_jsonl(paths.trajectories_file, Trajectory))


def _digest(records: Sequence[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r, sort_keys=True).encode("utf-8"))
    return h.hexdigest()[:16]


def _register(run: Any, cfg: Config, out: Path, method: str, extra_tags: dict[str, Any]) -> str:
    from components.tracking import register_model_dir

    version = register_model_dir(
        run,
        out,
        REGISTERED_MODEL,
        aliases=(CANDIDATE_ALIAS, method),
        tags={
            "method": method,
            "base_model": cfg.agent.model,
            "profile": cfg.profile,
            **extra_tags,
        },
    )
    run.set_tags({"registered_model": f"{REGISTERED_MODEL}/{version}"})
    return version


def train_sft_baseline(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage train_sft_baseline: behaviour cloning on successful train trajectories."""
    from components.agent.baselines import (
        load_base_policy,
        policy_settings,
        save_policy,
        train_sft_policy,
    )
    from components.agent.sft_data import build_sft_examples, corpus
    from components.experience.sft import prepare_checkpoints
    from components.lm.models import count_parameters
    from components.tracking import stage_run

    acfg, s = cfg.agent, cfg.agent.sft
    settings = policy_settings(acfg)
    start = time.perf_counter()
    trajectories = _load_trajectories(paths)
    train, stats = build_sft_examples(
        trajectories,
        settings,
        policies=s.policies,
        skip_invalid=s.skip_invalid,
        limit=s.max_train_examples,
        seed=acfg.seed,
    )
    if not train:
        raise ValueError("no successful train-split trajectory to clone")
    # a teacher-forced loss on validation trajectories (never the test split)
    held_out = (
        build_sft_examples(
            trajectories, settings, limit=s.eval_loss_examples, seed=acfg.seed, split="validation"
        )[0]
        if s.eval_loss_examples
        else []
    )
    build_seconds = time.perf_counter() - start
    log.info("built %d SFT examples in %.1f s: %s", len(train), build_seconds, stats)
    fingerprint = {
        "agent": acfg.model_dump(mode="json", exclude=_NOT_IN_FINGERPRINT),
        "settings": asdict(settings),
        "examples": _digest([ex.to_sft() for ex in train]),
    }
    ckpt = checkpoint_dir(paths, SFT)
    prepare_checkpoints(ckpt, fingerprint)
    model, tokenizer = load_base_policy(
        acfg, list(corpus(train)), paths.root / "models" / "base", ckpt / "tokenizer"
    )
    n_params = count_parameters(model)
    data = {"trajectories": paths.trajectories_file}
    with stage_run("train_sft", "agent", cfg, ("agent",), paths.root, data) as run:
        run.set_tags({"method": SFT, "base_model": acfg.model})
        model, result = train_sft_policy(
            model, tokenizer, train, acfg, ckpt, fingerprint=fingerprint, eval_examples=held_out
        )
        metrics: dict[str, Any] = {
            **result.metrics(),
            **{f"data_{k}": v for k, v in stats.items()},
            "n_parameters": n_params,
            "n_eval_loss_examples": len(held_out),
            "build_seconds": round(build_seconds, 2),
            "real_steps": 0,  # offline data only: no env interaction while training
            "offline_transitions": stats["examples"],
        }
        meta = {
            "method": SFT,
            "base_model": acfg.model,
            "tiny_preset": acfg.tiny_preset if acfg.model == "tiny" else None,
            "n_parameters": n_params,
            "real_steps": 0,
            "offline_transitions": stats["examples"],
            "examples_digest": fingerprint["examples"],
        }
        out = policy_dir(paths, SFT)
        save_policy(model, tokenizer, out, settings, meta)
        run.log_metrics(metrics)
        run.log_dict(result.log_history, "sft/log_history.json")
        version = _register(run, cfg, out, SFT, {})
    write_json(paths.metrics / AGENT_DIR / f"{SFT}.json", numbers(metrics))
    shutil.rmtree(ckpt, ignore_errors=True)  # finished: the next run starts fresh
    log.info("SFT policy trained: %s", result.metrics())
    return {**metrics, "registered_version": version, "model_dir": str(out)}


def train_dpo_baseline(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage train_dpo_baseline: DPO from the SFT policy on offline preference pairs."""
    from components.agent.baselines import load_settings, save_policy, train_dpo_policy
    from components.agent.dpo_data import build_pairs
    from components.experience.sft import prepare_checkpoints
    from components.lm.models import load_pretrained_dir
    from components.tracking import dvc_md5, stage_run

    acfg, d = cfg.agent, cfg.agent.dpo
    sft_dir = policy_dir(paths, SFT)
    settings = load_settings(sft_dir)  # the SFT policy's prompt shape, whatever agent says now
    trajectories = _load_trajectories(paths)
    pairs, stats = build_pairs(
        trajectories,
        settings,
        max_rejected_per_state=d.max_rejected_per_state,
        limit=d.max_pairs,
        seed=acfg.seed,
    )
    if not pairs:
        raise ValueError("no preference pair could be built from the train trajectories")
    log.info("built %d preference pairs: %s", len(pairs), stats)
    fingerprint = {
        "dpo": d.model_dump(mode="json", exclude=_NOT_IN_FINGERPRINT["dpo"]),
        "max_length": acfg.max_length,
        "sft_model": dvc_md5(sft_dir),
        "pairs": _digest([p.to_dpo() for p in pairs]),
    }
    ckpt = checkpoint_dir(paths, DPO)
    prepare_checkpoints(ckpt, fingerprint)
    model, tokenizer = load_pretrained_dir(sft_dir)
    data = {"trajectories": paths.trajectories_file, "sft_policy": sft_dir}
    with stage_run("train_dpo", "agent", cfg, ("agent",), paths.root, data) as run:
        run.set_tags({"method": DPO, "base_model": acfg.model})
        model, result = train_dpo_policy(
            model, tokenizer, pairs, acfg, ckpt, fingerprint=fingerprint
        )
        n_pairs_used = result.n_pairs
        metrics: dict[str, Any] = {
            **result.metrics(),
            **{f"data_{k}": v for k, v in stats.items()},
            "real_steps": 0,  # offline data only
        }
        meta = {
            "method": DPO,
            "base_model": acfg.model,
            "init": "sft",
            "real_steps": 0,
            "preference_pairs": n_pairs_used,
            "pairs_digest": fingerprint["pairs"],
        }
        out = policy_dir(paths, DPO)
        save_policy(model, tokenizer, out, settings, meta)
        run.log_metrics(metrics)
        run.log_dict(result.log_history, "dpo/log_history.json")
        version = _register(run, cfg, out, DPO, {"init": "sft"})
    write_json(paths.metrics / AGENT_DIR / f"{DPO}.json", numbers(metrics))
    shutil.rmtree(ckpt, ignore_errors=True)
    log.info("DPO policy trained: %s", result.metrics())
    return {**metrics, "registered_version": version, "model_dir": str(out)}


def training_real_steps(paths: Paths, method: str, meta: dict[str, Any]) -> int | None:
    """Real env steps a method's training used: its policy.json, else its training metrics."""
    if meta.get("real_steps") is not None:
        return int(meta["real_steps"])
    path = paths.metrics / AGENT_DIR / f"{method}.json"
    if path.exists():
        value = json.loads(path.read_text(encoding="utf-8")).get("real_steps")
        return int(value) if value is not None else None
    return None  # unknown: never invented


def evaluate_policy(cfg: Config, paths: Paths, method: str) -> dict[str, Any]:
    """Stage evaluate_<method>: the saved policy on the held-out real test tasks."""
    from components.agent.baselines import load_meta
    from components.agent.evaluate import TEST_SPLIT, TransformersPolicy, evaluate, held_out_tasks
    from components.envs import make_env
    from components.stages.data import load_tasks
    from components.tracking import stage_run, tag_model_alias

    e = cfg.agent.eval
    pdir = policy_dir(paths, method)
    if not (pdir / "config.json").exists():
        raise FileNotFoundError(f"no policy under {pdir}: train `{method}` first")
    tasks = held_out_tasks(load_tasks(paths))
    if not tasks:
        raise ValueError("the task suite has no test split to evaluate on")
    meta = load_meta(pdir)
    policy = TransformersPolicy.from_dir(
        pdir,
        max_new_tokens=e.max_new_tokens,
        temperature=e.temperature,
        batch_size=e.gen_batch_size,
    )
    data = {"policy": pdir, "tasks": paths.tasks_file}
    with stage_run(
        f"evaluate_policy@{method}", "agent", cfg, ("agent", "env"), paths.root, data
    ) as run:
        result = evaluate(
            policy,
            tasks,
            lambda: make_env(cfg.env, paths.root),
            seeds=e.seeds,
            greedy=e.temperature == 0,
            history_len=policy.settings.history_len,
            parallel=e.parallel_envs,
        )
        summary: dict[str, Any] = {
            "env": cfg.env.name,
            "method": method,
            "split": TEST_SPLIT,
            **result.summary(),
            "real_steps": training_real_steps(paths, method, meta),
        }
        run.set_tags({"method": method, "split": TEST_SPLIT})
        run.log_metrics(numbers(summary))
        run.log_dict(result.rows(), f"eval/{method}_episodes.json")
        tag_model_alias(
            REGISTERED_MODEL,
            method,
            {
                "eval.success": round(summary["success"], 4),
                "eval.ci_low": round(summary["ci_low"], 4),
                "eval.ci_high": round(summary["ci_high"], 4),
                "eval.episodes": summary["episodes"],
                "eval.run_id": run.run_id,
            },
        )
    write_json(eval_file(paths, method), summary)
    log.info(
        "%s on %d test episodes: success %.3f [%.3f, %.3f], malformed %.3f, %d real steps",
        method,
        summary["episodes"],
        summary["success"],
        summary["ci_low"],
        summary["ci_high"],
        summary["malformed_rate"],
        summary["eval_real_steps"],
    )
    return summary


def build_table1(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage build_table1: metrics/table1.json and its markdown from the evaluations."""
    from components.agent.table1 import build_table, load_evaluations, markdown
    from components.tracking import stage_run

    table = build_table(load_evaluations(paths.metrics / EVAL_DIR))
    text = markdown(table)
    write_json(paths.metrics / TABLE1_METRICS, table)
    md_path = paths.metrics / TABLE1_MARKDOWN
    md_path.write_text(text, encoding="utf-8")
    with stage_run("table1", "agent", cfg, (), paths.root) as run:
        for env, rows in table.items():
            run.log_metrics({env: {m: r for m, r in rows.items() if r is not None}})
        run.log_dict(table, "table1/table1.json")
        run.log_artifact(md_path, "table1")
    log.info("Table 1:\n%s", text)
    return {"table": table, "markdown": text}
