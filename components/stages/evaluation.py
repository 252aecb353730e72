"""Model-quality stages: LLM judge of synthetic experience, drift, and the run report.

``judge``: for each trained experience-model variant, synthetic trajectories are produced
by playing the recorded actions of sampled validation episodes in the synthetic env
(so every transition can be replayed in the real simulator), then scored by the judge
(grounded replay offline, or GPT-4o / any OpenAI-compatible server).
``drift``: Evidently reports of real (train) vs synthetic transitions per co-evolution
iteration, from the DreamGym stage's synthetic trajectories.
``report``: one markdown + PNG summary of the run from the metrics files.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from pathlib import Path
from typing import Any

from components.artifacts import synthetic_dir
from components.config import Config, Paths
from components.schema import Task, Trajectory, read_jsonl
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")
MIN_REPORTS_PER_WORKER = 4

JUDGE_METRICS = "judge.json"
DRIFT_METRICS = "drift.json"
DRIFT_INDEX = "drift.html"
RECORDED_POLICY = "recorded-actions"


def reports_dir(paths: Paths) -> Path:
    """Human-readable reports (drift HTML, the run report)."""
    return paths.root / "reports"


def drift_reports_dir(paths: Paths) -> Path:
    """The Evidently HTML report of every (synthetic run, iteration)."""
    return reports_dir(paths) / "drift"


def drift_index(paths: Paths) -> Path:
    """The drift summary page linking the Evidently reports."""
    return reports_dir(paths) / DRIFT_INDEX


def _require_trajectories(paths: Paths) -> None:
    """The ingested real trajectories (raises with a hint when they are missing)."""
    if not paths.trajectories_file.exists():
        raise FileNotFoundError(f"{paths.trajectories_file} missing: run `dreamgym ingest`")


def replay_recorded_actions(
    cfg: Config, paths: Paths, variant: str, episodes: list[Trajectory]
) -> tuple[list[Trajectory], dict[str, float]]:
    """Synthetic trajectories of ``episodes``' recorded actions under one variant + env stats.

    An episode whose first answer is malformed twice ends with no transition and yields
    no trajectory; the stats (``n_failed_malformed``, ``malformed_rate`` ...) count it.
    """
    from components.artifacts import experience_model_dir
    from components.experience.grounded import is_grounded_dir
    from components.experience.synthetic_env import RealStateIndex
    from components.stages.experience import llm_dream_env

    mdir = experience_model_dir(paths, variant)
    tasks = {t.task_id: t for t in read_jsonl(paths.tasks_file, Task)}
    if is_grounded_dir(mdir):
        from components.experience.grounded import GroundedModel
        from components.experience.grounded_env import GroundedVectorEnv

        initial = {
            e.task_id: (e.initial_state, tuple(e.steps[0].admissible_actions or ()))
            for e in episodes
            if e.steps
        }
        venv: Any = GroundedVectorEnv(
            GroundedModel.load(mdir),
            max_steps=cfg.synthetic.max_steps,
            env_name=cfg.env.name,
            namespace=f"judge-{variant}",
            initial_states=initial,
        )
        return _replay(venv, episodes, tasks, variant)
    index = RealStateIndex.from_trajectories(episodes)
    venv = llm_dream_env(cfg, paths, mdir, index, namespace=f"judge-{variant}")
    return _replay(venv, episodes, tasks, variant)


def _replay(
    venv: Any, episodes: list[Trajectory], tasks: dict[str, Task], variant: str
) -> tuple[list[Trajectory], dict[str, float]]:
    """Step ``episodes``' recorded actions through a synthetic vector env, all together."""
    from components.progress import progress_bar

    venv.reset([tasks[e.task_id] for e in episodes])
    depth = 0
    bar = progress_bar(
        total=max((e.n_steps for e in episodes), default=0),
        desc=f"synthetic replay ({variant})",
        unit="step",
        mininterval=2.0,
    )
    while not venv.done:
        actions = [
            e.steps[depth].action if live and depth < e.n_steps else None
            for e, live in zip(episodes, venv.active, strict=True)
        ]
        if not any(actions):
            break
        venv.step(actions)
        depth += 1
        bar.update(1)
    bar.close()
    trajectories = venv.trajectories(policy=RECORDED_POLICY, iteration=0, checkpoint=variant)
    return trajectories, venv.metrics()


def judge(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage judge: the four criteria per experience-model variant; metrics/judge.json."""
    from components.artifacts import experience_model_dir
    from components.envs import make_env
    from components.evaluation.judge import compare_variants, make_judge, run_judge
    from components.stages.experience import evaluable_variants
    from components.tracking import run_provenance, stage_run

    _require_trajectories(paths)
    if not paths.tasks_file.exists():
        raise FileNotFoundError(f"{paths.tasks_file} missing: run `dreamgym generate-tasks`")
    variants = evaluable_variants(paths)
    if not variants:
        raise FileNotFoundError(
            f"{experience_model_dir(paths)} missing: run `dreamgym train-experience-model`"
        )
    trajectories = [
        t for t in read_jsonl(paths.trajectories_file, Trajectory) if t.split == "validation"
    ]
    random.Random(cfg.judge.seed).shuffle(trajectories)
    episodes = trajectories[: cfg.judge.n_trajectories]
    tasks = {t.task_id: t for t in read_jsonl(paths.tasks_file, Task)}
    env = make_env(cfg.env, paths.root) if cfg.judge.backend == "grounded" else None
    summaries: dict[str, Any] = {}
    replayed: dict[str, dict[str, Any]] = {}
    data = {"trajectories": paths.trajectories_file}
    with stage_run("judge", "evaluation", cfg, ("judge", "synthetic"), paths.root, data) as run:
        try:
            scorer = make_judge(cfg.judge, env, tasks)
            for i, variant in enumerate(variants, 1):
                log.info("judge: variant %s (%d of %d)", variant, i, len(variants))
                synthetic, env_stats = replay_recorded_actions(cfg, paths, variant, episodes)
                out = run_judge(scorer, synthetic, cfg.judge.n_trajectories, cfg.judge.seed)
                summaries[variant] = out.summary
                # a variant whose answers are all malformed has nothing to judge: say so
                replayed[variant] = {
                    "n_episodes": len(episodes),
                    "n_without_transition": len(episodes) - len(synthetic),
                    "malformed_rate": env_stats.get("malformed_rate", 0.0),
                }
                run.log_dict(out.rows, f"judge/{variant}/rows.json")
                run.log_dict(env_stats, f"judge/{variant}/synthetic_env.json")
        finally:
            if env is not None:
                env.close()
            close = getattr(locals().get("scorer"), "close", None)
            if close is not None:
                close()
        table, markdown = compare_variants(summaries)
        for variant, extra in replayed.items():
            table[variant].update(extra)
        run.log_text(markdown, "judge/variants.md")
        run.log_metrics({f"{v}.{k}": x for v, m in table.items() for k, x in numbers(m).items()})
    table["_provenance"] = run_provenance(paths.root, cfg.profile, cfg.env.name)
    write_json(paths.metrics / JUDGE_METRICS, table)
    log.info("judge:\n%s", markdown)
    return table


def _drift_jobs(fn: Any, jobs: list[tuple[Any, ...]], workers: int) -> list[Any]:
    from components.stages.parallel import run_jobs

    # a spawned worker's start-up (torch + Evidently imports, ~7 s) costs a few reports:
    # the ci profile's 3 iterations run in-process, the cpu profile's 72 in `workers`
    return run_jobs(fn, jobs, max(1, min(workers, len(jobs) // MIN_REPORTS_PER_WORKER)))


def drift(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage drift: real vs synthetic transitions per iteration (Evidently HTML + flags)."""
    from components.evaluation.drift import (
        drift_by_run,
        drift_metrics,
        index_html,
    )
    from components.tracking import run_provenance, stage_run

    _require_trajectories(paths)
    files = sorted(synthetic_dir(paths).glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(
            f"no synthetic trajectories in {synthetic_dir(paths)}: run `dreamgym train-dreamgym`"
        )
    real = [
        s
        for t in read_jsonl(paths.trajectories_file, Trajectory)
        if t.split == "train"
        for s in t.steps
    ]
    out_dir = drift_reports_dir(paths)
    out_dir.mkdir(parents=True, exist_ok=True)  # a DVC output even when no report is kept
    metrics: dict[str, Any] = {}
    data = {f"synthetic_{f.stem}": f for f in files}
    with stage_run("drift", "evaluation", cfg, ("drift",), paths.root, data) as run:
        runs = {f.stem: [s for t in read_jsonl(f, Trajectory) for s in t.steps] for f in files}
        # every run's reports in one worker pool, against one real reference
        results = drift_by_run(
            real,
            runs,
            cfg.drift,
            out_dir,
            run_jobs=partial(_drift_jobs, workers=cfg.drift.workers),
        )
        for name, result in results.items():
            # an empty run (every answer malformed) says so instead of looking drift-free
            metrics[name] = {
                "drifted": result["drifted"],
                "n_synthetic": len(runs[name]),
                **drift_metrics(result),
            }
            for html in sorted((out_dir / name).glob("*.html")):
                run.log_artifact(html, f"drift/{name}")
        index = drift_index(paths)
        index_html(results, index, cfg.drift.drift_share)
        run.log_artifact(index, "drift")
        run.log_dict(metrics, "drift/summary.json")
        run.log_metrics(metrics)  # per run and iteration: drift_share, n_drifted (numbers)
        flagged = ",".join(k for k, m in metrics.items() if m["drifted"])
        run.set_tags({"drift.flagged": flagged or "none"})
    write_json(
        paths.metrics / DRIFT_METRICS,
        {**metrics, "_provenance": run_provenance(paths.root, cfg.profile, cfg.env.name)},
    )
    flagged = [k for k, m in metrics.items() if m["drifted"]]
    log.info("drift: %s", f"flagged for {flagged}" if flagged else "no drift flagged")
    return metrics


def report(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage report: reports/report.md + PNG plots from the metrics files, to MLflow."""
    from components.evaluation.report import build_report
    from components.tracking import stage_run

    with stage_run("report", "evaluation", cfg, ("report",), paths.root, {}) as run:
        result = build_report(
            paths.metrics,
            reports_dir(paths),
            cfg.report,
            drift_threshold=cfg.drift.drift_share,
            env=cfg.env.name,
        )
        run.log_artifact(result.markdown, "report")
        for plot in result.plots:
            run.log_artifact(plot, "report")
    log.info("report: %s (%d plots)", result.markdown, len(result.plots))
    return {"markdown": str(result.markdown), "plots": [str(p) for p in result.plots]}
