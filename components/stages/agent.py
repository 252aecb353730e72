"""Agent stages: the SFT and DPO baselines, held-out evaluation of any method, Table 1.

Every policy method is trained once per training seed (``agent.seeds``), each seed in
its own worker process (components/stages/parallel.py), into
``models/policy/<method>/seed-<s>``; the seed-0 policy is registered in MLflow as
``policy`` (aliases ``candidate`` and the method). ``evaluate_policy`` plays every seed's
policy on the held-out test tasks (sampled, and greedily) and writes the episodes to
``data/eval/<method>.jsonl`` and a summary to ``metrics/eval/<method>.json``; the
``random`` method is the random-admissible baseline on the same tasks, seeds and step
limit. ``build_table1`` turns the episodes into ``metrics/table1.json`` (CIs, paired
differences from SFT and random, provenance) and a markdown table.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

from components.artifacts import (
    AGENT_DIR,
    DPO,
    EVAL_DIR,
    RANDOM,
    SFT,
    agent_metrics_file,
    episodes_file,
    eval_file,
    policy_dir,
    seed_dir,
)
from components.config import Config, Paths
from components.io import atomic_outputs, read_json
from components.schema import Trajectory, read_jsonl
from components.stages.common import alias_tags, json_text, numbers, write_json

log = logging.getLogger("dreamgym")

REGISTERED_MODEL = "policy"
CANDIDATE_ALIAS = "candidate"
TABLE1_METRICS = "table1.json"
TABLE1_MARKDOWN = "table1.md"
TEST_SPLIT = "test"


def load_trajectories(paths: Paths) -> list[Trajectory]:
    """The ingested trajectories (raises with a hint when missing)."""
    if not paths.trajectories_file.exists():
        raise FileNotFoundError(f"{paths.trajectories_file} missing: run `dreamgym ingest`")
    return list(read_jsonl(paths.trajectories_file, Trajectory))


def register(run: Any, cfg: Config, out: Path, method: str, tags: dict[str, Any]) -> str:
    """Register a policy directory as ``policy`` with aliases ``candidate`` and the method.

    An ablation run registers under ``policy-ablation`` with no alias (promotion.py).
    """
    from components.evaluation.promotion import registry_target
    from components.model_registry import register_model_dir

    name, aliases, extra = registry_target(
        REGISTERED_MODEL, (CANDIDATE_ALIAS, method), cfg.ablation.model_dump()
    )
    version = register_model_dir(
        run,
        out,
        name,
        aliases=aliases,
        tags={
            "method": method,
            "policy": cfg.agent.policy,
            "profile": cfg.profile,
            "env": cfg.env.name,  # promotion compares held-out figures of one env only
            **tags,
            **extra,
        },
        kind="policy",  # a pyfunc model: mlflow.pyfunc.load_model("models:/policy@...")
    )
    run.set_tags({"registered_model": f"{name}/{version}"})
    return version


def seed_summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Training metrics of every seed, plus the mean of each numeric one over seeds."""
    out: dict[str, Any] = {"seeds": len(per_seed)}
    keys = set.intersection(*(set(numbers(m)) for m in per_seed.values())) if per_seed else set()
    for k in sorted(keys):
        out[k] = sum(float(m[k]) for m in per_seed.values()) / len(per_seed)
    out["per_seed"] = {str(s): numbers(m) for s, m in sorted(per_seed.items())}
    return out


def log_seeds(run: Any, stage: str, results: dict[int, dict[str, Any]], step_key: str) -> None:
    """One nested MLflow run per seed: its final metrics and its per-step curves."""
    for seed, result in sorted(results.items()):
        with run.child(f"{stage}/seed-{seed}", {"seed": seed}) as child:
            child.log_metrics(numbers(result))
            child.log_history(result.get("history", []), step_key)


# ----------------------------------------------------------------------------- SFT / DPO


def sft_seed(cfg: Config, paths: Paths, seed: int, demos: list, held_out: list) -> dict[str, Any]:
    """Worker: behaviour cloning of the expert for one seed (scoring policy)."""
    from components.agent.loading import new_scorer, save_policy
    from components.agent.scorer_training import accuracy, train_sft_as

    policy = new_scorer(cfg, seed)
    result = train_sft_as(policy, demos, cfg.agent.sft, seed)
    result["validation_accuracy"] = accuracy(policy, held_out) if held_out else 0.0
    meta = {"method": SFT, "seed": seed, "policy": "scorer", "real_steps": 0}
    save_policy(policy, policy_dir(paths, SFT, seed), meta)
    return result


def dpo_seed(cfg: Config, paths: Paths, seed: int, demos: list) -> dict[str, Any]:
    """Worker: DPO from the seed's SFT policy (scoring policy)."""
    from components.agent.loading import load_policy, save_policy
    from components.agent.scorer_training import preference_pairs, train_dpo

    d = cfg.agent.dpo
    policy = load_policy(policy_dir(paths, SFT, seed))
    pairs = preference_pairs(demos, d.max_rejected_per_state, seed=seed)
    if d.max_pairs is not None and d.max_pairs < len(pairs):
        # a seeded subset, as the LM policy's (the first pairs are the first games' states)
        pairs = random.Random(seed).sample(pairs, d.max_pairs)
    result = train_dpo(
        policy,
        pairs,
        beta=d.beta,
        sft_weight=d.sft_weight,
        loss_type=d.loss_type,
        epochs=max(1, round(d.epochs)),
        learning_rate=d.learning_rate,
        batch_size=d.batch_size,
        seed=seed,
    )
    meta = {"method": DPO, "seed": seed, "policy": "scorer", "init": SFT, "real_steps": 0}
    save_policy(policy, policy_dir(paths, DPO, seed), meta)
    return result


def _offline_stage(cfg: Config, paths: Paths, method: str) -> dict[str, Any]:
    """SFT or DPO over every seed (workers), logged and registered."""
    from components.agent.scorer_training import expert_steps
    from components.stages.parallel import run_jobs
    from components.tracking import stage_run

    start = time.perf_counter()
    trajectories = load_trajectories(paths)
    seeds = list(cfg.agent.seeds)
    data = {"trajectories": paths.trajectories_file}
    if method == DPO:
        data["sft_policy"] = policy_dir(paths, SFT)
    with stage_run(f"train_{method}", "agent", cfg, ("agent",), paths.root, data) as run:
        run.set_tags({"method": method, "policy": cfg.agent.policy})
        if cfg.agent.policy == "lm":
            from components.stages.agent_lm import train_dpo_lm, train_sft_lm

            train = train_sft_lm if method == SFT else train_dpo_lm
            results = {s: train(cfg, paths, s) for s in seeds}
            stats: dict[str, Any] = {}
        else:
            demos, stats = expert_steps(trajectories)
            if not demos:
                from components.io import InputError

                raise InputError(
                    f"no expert demonstration in the train split of {paths.trajectories_file}"
                    " to clone: was every raw line quarantined (data/quarantine/)?"
                )
            if method == SFT:
                held_out, _ = expert_steps(trajectories, split="validation")
                jobs = [(cfg, paths, s, demos, held_out) for s in seeds]
                outs = run_jobs(sft_seed, jobs, cfg.agent.workers)
            else:
                outs = run_jobs(
                    dpo_seed, [(cfg, paths, s, demos) for s in seeds], cfg.agent.workers
                )
            results = dict(zip(seeds, outs, strict=True))
        log_seeds(run, f"train_{method}", results, "epoch")
        summary = {
            **seed_summary(results),
            **{f"data_{k}": v for k, v in stats.items()},
            "real_steps": 0,  # offline data only: no env interaction while training
            "stage": f"train_{method}",
            "wall_seconds": round(time.perf_counter() - start, 2),
        }
        run.log_metrics(numbers(summary))
        init = {"init": SFT} if method == DPO else {}
        version = register(run, cfg, policy_dir(paths, method, seeds[0]), method, init)
    write_json(agent_metrics_file(paths, method), summary)
    log.info("%s trained on %d seeds: %s", method, len(seeds), numbers(summary))
    return {**summary, "registered_version": version}


def train_sft_baseline(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage train_sft: behaviour cloning of the expert's demonstrations, every seed."""
    return _offline_stage(cfg, paths, SFT)


def train_dpo_baseline(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage train_dpo: DPO from each seed's SFT policy (expert vs other commands)."""
    return _offline_stage(cfg, paths, DPO)


# ----------------------------------------------------------------------------- evaluation


def training_real_steps(paths: Paths, method: str) -> float | None:
    """Mean real env steps a method's training used per seed (its training metrics)."""
    if method == RANDOM:
        return 0
    path = agent_metrics_file(paths, method)
    if path.exists():
        value = read_json(path).get("real_steps")
        return value if value is not None else None
    return None  # unknown: never invented


def eval_job(
    cfg: Config,
    paths: Paths,
    method: str,
    seed: int,
    modes: tuple[str, ...],
    method_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Worker: one seed's policy (or the random baseline) on every test task, per mode.

    Sampled: ``agent.eval.passes`` passes, pass p with sampling and env seed
    ``seed + PASS_SEED_STRIDE * p`` (pass 0: the seed itself); greedy: one pass. Every
    pass reseeds, so a pass plays the same whichever job or order runs it.
    ``method_dir``: the policy's seed folders live there (default models/policy/<method>).
    """
    import torch

    from components.agent.evaluate import (
        PASS_SEED_STRIDE,
        episode_rows,
        held_out_tasks,
        run_episodes,
    )
    from components.agent.loading import Acting, RandomAdmissible, load_policy
    from components.envs import env_factory
    from components.stages.data import load_tasks

    tasks = held_out_tasks(load_tasks(paths))
    e = cfg.agent.eval
    loaded = None
    if method != RANDOM:  # an LM policy may decode on a server (serving.policy_backend)
        where = seed_dir(method_dir, seed) if method_dir else policy_dir(paths, method, seed)
        loaded = load_policy(where, cfg.agent, serving=cfg.serving, root=paths.root)
    rows: list[dict[str, Any]] = []
    # one factory for every pass: a later pass restarts the games the first one loaded
    # and reads the answers to the command paths played before
    make = env_factory(cfg.env, paths.root)
    for mode, p in [(m, p) for m in modes for p in range(e.passes if m == "sampled" else 1)]:
        run_seed = seed + PASS_SEED_STRIDE * p
        if loaded is None:
            policy: Any = RandomAdmissible(run_seed)
        else:
            policy = Acting(loaded, e.temperature if mode == "sampled" else 0.0, e.max_new_tokens)
        torch.manual_seed(run_seed)
        name = f"{method} seed {seed} {mode}" + (f" pass {p}" if e.passes > 1 else "")
        records = run_episodes(
            policy,
            tasks,
            make,
            seed=run_seed,
            parallel=e.parallel_envs,
            desc=f"eval {name}",
        )
        wins = sum(r.success for r in records)
        log.info("evaluated %s: %d/%d test episodes won", name, wins, len(records))
        rows += episode_rows(method, mode, seed, p, records)
    return rows


def evaluate_policy(cfg: Config, paths: Paths, method: str) -> dict[str, Any]:
    """Stage evaluate_policy@<method>: every seed on the held-out test tasks."""
    from components.agent.evaluate import held_out_tasks
    from components.agent.loading import is_policy_dir
    from components.agent.table1 import GREEDY, SAMPLED, mode_summary
    from components.evaluation.promotion import ablation_of
    from components.model_registry import tag_model_alias
    from components.stages.data import load_tasks
    from components.stages.parallel import run_jobs
    from components.tracking import stage_run

    start = time.perf_counter()
    seeds = cfg.seeds_of(method)  # the method's training seeds (random: agent.seeds)
    if method != RANDOM:
        missing = [s for s in seeds if not is_policy_dir(policy_dir(paths, method, s))]
        if missing:
            raise FileNotFoundError(
                f"no {method} policy for seeds {missing} under {policy_dir(paths, method)}: "
                f"train `{method}` first"
            )
    if not held_out_tasks(load_tasks(paths)):  # e.g. tasks.split leaves no test game
        from components.io import InputError

        raise InputError(
            f"{paths.tasks_file} has no test split to evaluate on: regenerate the suite "
            "(`dreamgym generate-tasks --force`) with test games"
        )
    modes = [SAMPLED] + ([GREEDY] if cfg.agent.eval.greedy and method != RANDOM else [])
    # one job per seed plays all its modes on one set of loaded games (greedy episodes
    # mostly retrace sampled ones); a lone seed's modes split to keep two cores busy
    if len(seeds) > 1:
        jobs = [(cfg, paths, method, s, tuple(modes)) for s in seeds]
    else:
        jobs = [(cfg, paths, method, s, (m,)) for m in modes for s in seeds]
    data = {"tasks": paths.tasks_file}
    if method != RANDOM:
        data["policy"] = policy_dir(paths, method)
    with stage_run(
        f"evaluate_policy@{method}", "agent", cfg, ("agent", "env"), paths.root, data
    ) as run:
        rows = [r for part in run_jobs(eval_job, jobs, cfg.agent.workers) for r in part]
        rows.sort(key=lambda r: (modes.index(r["mode"]), seeds.index(r["seed"])))  # stable
        summary: dict[str, Any] = {
            "env": cfg.env.name,
            "method": method,
            "split": TEST_SPLIT,
            "headline": SAMPLED,
            "real_steps": training_real_steps(paths, method),
        }
        for m in modes:
            part = mode_summary(rows, m)
            if part is not None:
                summary[m] = part
        summary.update({k: summary[SAMPLED][k] for k in ("success", "ci_low", "ci_high")})
        summary["episodes"] = summary[SAMPLED]["episodes"]
        summary["seeds"] = summary[SAMPLED]["seeds"]
        summary["eval_real_steps"] = sum(r["steps"] for r in rows)
        summary["invalid_rate"] = sum(r["invalid"] for r in rows) / max(
            1, summary["eval_real_steps"]
        )
        summary["env_errors"] = sum(r["env_error"] is not None for r in rows)
        summary["eval_seconds"] = round(time.perf_counter() - start, 2)
        run.set_tags({"method": method, "split": TEST_SPLIT})
        greedy = numbers(summary.get(GREEDY, {}))
        run.log_metrics(numbers(summary) | {f"greedy.{k}": v for k, v in greedy.items()})
        run.log_dict(rows, f"eval/{method}_episodes.json")
        # an ablation run's policy is not behind policy@<method>: tag nothing there
        if method != RANDOM and ablation_of(cfg.ablation.model_dump()) is None:
            # eval.success is the method's (all seeds); the version is seeds[0]'s policy,
            # so its own figures go beside it
            own = summary[SAMPLED]
            ci = own["per_seed_ci"][str(seeds[0])]
            tag_model_alias(
                REGISTERED_MODEL,
                method,
                alias_tags(
                    "eval", summary, ("success", "ci_low", "ci_high"), "episodes", run.run_id
                )
                | {
                    "eval.version_seed": seeds[0],
                    "eval.version_success": round(own["per_seed"][str(seeds[0])], 4),
                    "eval.version_ci_low": round(ci["ci_low"], 4),
                    "eval.version_ci_high": round(ci["ci_high"], 4),
                },
            )
    out = episodes_file(paths, method)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(out)
    write_json(eval_file(paths, method), summary)
    log.info(
        "%s on %d test episodes x %d seeds: sampled %.3f [%.3f, %.3f]%s",
        method,
        summary["episodes"],
        summary["seeds"],
        summary["success"],
        summary["ci_low"],
        summary["ci_high"],
        f", greedy {summary[GREEDY]['success']:.3f}" if GREEDY in summary else "",
    )
    return summary


def build_table1(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage table1: metrics/table1.json (with provenance) and its markdown."""
    from components.agent.table1 import (
        METHODS,
        build_table,
        keep_other_envs,
        load_episodes,
        markdown,
    )
    from components.cpu_kernels import kernels_in_use
    from components.evaluation.headline import HEADLINE_DIR, TABLE1_HEADLINE, table1_headline
    from components.tracking import run_provenance, stage_run

    episodes = load_episodes(paths.data / EVAL_DIR)
    steps = {m: training_real_steps(paths, m) for m in METHODS}
    table = build_table(cfg.env.name, episodes, steps)
    if not any(table[cfg.env.name].values()):  # a table of "not evaluated" would wipe results
        raise FileNotFoundError(
            f"no {cfg.env.name} evaluation episodes under {paths.data / EVAL_DIR}: run "
            "`dreamgym evaluate-random` and `dreamgym evaluate-policy METHOD` first"
        )
    table["_provenance"] = {
        **run_provenance(paths.root, cfg.profile, cfg.env.name),
        "cpu_kernels": kernels_in_use(),  # "avx2": reproducible on any AVX2 host
    }
    table["_headline"] = "sampled"
    # one file for every env: the other envs' rows (their own runs) stay (dvc.yaml: persist)
    previous = paths.metrics / TABLE1_METRICS
    # a damaged file stops the stage (never drop the other envs' rows silently)
    old = read_json(previous) if previous.exists() else {}
    table = keep_other_envs(table, old, cfg.env.name)
    text = markdown(table)
    # the one-screen part of Table 1 that `dvc metrics show` / `dvc exp show` print
    headline = table1_headline(table, paths.metrics / AGENT_DIR, cfg.env.name)
    md_path = paths.metrics / TABLE1_MARKDOWN
    # the three files replace the old ones together: a kill never leaves them disagreeing
    with atomic_outputs() as temp:
        temp(paths.metrics / TABLE1_METRICS).write_text(json_text(table), encoding="utf-8")
        temp(paths.metrics / HEADLINE_DIR / TABLE1_HEADLINE).write_text(
            json_text(headline), encoding="utf-8"
        )
        temp(md_path).write_text(text, encoding="utf-8")
    with stage_run("table1", "agent", cfg, (), paths.root) as run:
        for env, rows in table.items():
            if not env.startswith("_"):
                run.log_metrics({env: {m: r for m, r in rows.items() if r is not None}})
        run.log_dict(table, "table1/table1.json")
        run.log_artifact(md_path, "table1")
    log.info("Table 1:\n%s", text)
    return {"table": table, "markdown": text}
