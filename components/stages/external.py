"""``evaluate-external``: any trained policy on the user's own games or task list.

The policy is a saved policy folder, a method folder with ``seed-<s>`` folders (each
seed evaluated with its seed), a method name (``models/policy/<method>``) or a registry
alias ``policy@<alias>`` (``candidate``, ``champion``, a method). It plays every usable
task of the given game folders / globs / JSONL task lists (whatever their split: the
user chose them) beside the random-admissible baseline on the same tasks, seeds and step
limit. The success table (95% CIs by bootstrap over tasks and seeds, the paired
difference from random) goes to ``<out>/success.json`` and ``success.md``, the episodes to
``episodes.jsonl``, unusable games or lines to ``quarantined.jsonl``; the run is logged to
MLflow (``dreamgym-agent``, run ``evaluate_external``). Files in ``out`` that this
command did not write are never overwritten without ``force``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from components.artifacts import RANDOM, SEED_DIR, policy_dir
from components.config import Config, Paths
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")

POLICY = "policy"
SUCCESS_JSON, SUCCESS_MD = "success.json", "success.md"
EPISODES_FILE = "episodes.jsonl"
COMMAND = "`dreamgym evaluate-external`"


def _policy_dirs(path: Path) -> list[tuple[int | None, Path]]:
    """(training seed or None, folder) of a saved policy or a method's seed folders."""
    from components.agent.loading import is_policy_dir

    if is_policy_dir(path):
        return [(None, path)]
    prefix = SEED_DIR.split("{", 1)[0]
    seeds = [
        (int(p.name[len(prefix) :]), p)
        for p in path.glob(f"{prefix}*")
        if p.name[len(prefix) :].isdigit() and is_policy_dir(p)
    ]
    if not seeds:
        raise FileNotFoundError(f"{path}: no saved policy in it (nor seed-<s> folders)")
    return sorted(seeds)


def resolve_policy(spec: str, paths: Paths, scratch: Path) -> tuple[list[Any], dict[str, str]]:
    """The policy folders named by ``spec`` and what to record about where they came from."""
    from components.agent.table1 import METHODS

    path = Path(spec).expanduser()
    if path.exists():
        return _policy_dirs(path), {"policy": spec, "policy_dir": str(path.resolve())}
    if spec in METHODS and spec != RANDOM:
        folder = policy_dir(paths, spec)
        if not folder.exists():
            raise FileNotFoundError(f"{folder} missing: train `{spec}` first")
        return _policy_dirs(folder), {"policy": spec, "policy_dir": str(folder)}
    name, at, alias = spec.partition("@")
    if at and name and alias:
        from components.model_registry import download_model_version
        from components.tracking import configure

        configure(paths.root)
        version, local = download_model_version(name, alias, scratch)
        info = {"policy": spec, "registered_model": f"{name}/{version}"}
        return _policy_dirs(local), info
    raise FileNotFoundError(
        f"--policy {spec}: not a folder, a method ({', '.join(METHODS[1:])}) "
        "or a registry alias such as policy@candidate"
    )


def external_tasks(cfg: Config, games: list[str], task_lists: list[str], root: Path) -> Any:
    """The usable tasks of every source (paths relative to the current folder)."""
    from components.envs.external import (
        ExternalTasks,
        ExternalTasksError,
        games_tasks,
        merge_tasks,
        task_list_tasks,
    )

    if not games and not task_lists:
        raise ExternalTasksError("nothing to evaluate on: give --games and/or --tasks")
    if games and cfg.env.name != "textworld":
        raise ExternalTasksError(f"--games needs env.name textworld, not {cfg.env.name!r}")
    found = ExternalTasks()
    cwd = Path.cwd()
    for source in games:
        found.extend(games_tasks(str(cwd / source), root, "test", "external"))
    for source in task_lists:
        found.extend(task_list_tasks(cwd / source, root, None, cfg.env.name))
    found.tasks = merge_tasks([], found)
    return found


def _episodes(cfg: Config, paths: Paths, policy: Any, tasks: list, seed: int) -> list:
    import torch

    from components.agent.evaluate import run_episodes
    from components.envs import env_factory

    torch.manual_seed(seed)  # sampling policies draw from torch's generator
    make_env = env_factory(cfg.env, paths.root)
    return run_episodes(policy, tasks, make_env, seed=seed, parallel=cfg.agent.eval.parallel_envs)


def play(cfg: Config, paths: Paths, dirs: list, tasks: list) -> list[dict[str, Any]]:
    """Episode rows of the policy (every seed and mode) and of the random baseline."""
    from components.agent.evaluate import PASS_SEED_STRIDE, episode_rows
    from components.agent.loading import Acting, RandomAdmissible, load_policy
    from components.agent.table1 import GREEDY, SAMPLED

    e = cfg.agent.eval
    # one policy folder: the config's seeds are its sampling seeds; a method's seed folders
    # are each evaluated with their own seed (as evaluate-policy does)
    seeded = dirs[0][0] is not None
    runs = list(dirs) if seeded else [(s, dirs[0][1]) for s in cfg.agent.seeds]
    modes = [(SAMPLED, e.temperature)] + ([(GREEDY, 0.0)] if e.greedy else [])
    rows: list[dict[str, Any]] = []
    for seed, folder in runs:
        loaded = load_policy(folder, cfg.agent, serving=cfg.serving, root=paths.root)
        for mode, temperature in modes:
            for p in range(e.passes if mode == SAMPLED else 1):
                acting = Acting(loaded, temperature, e.max_new_tokens)
                played = _episodes(cfg, paths, acting, tasks, seed + PASS_SEED_STRIDE * p)
                rows += episode_rows(POLICY, mode, seed, p, played)
        for p in range(e.passes):
            run_seed = seed + PASS_SEED_STRIDE * p
            played = _episodes(cfg, paths, RandomAdmissible(run_seed), tasks, run_seed)
            rows += episode_rows(RANDOM, SAMPLED, seed, p, played)
    return rows


def success_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method (policy, random): success, 95% CI, episodes, tasks, seeds, vs random."""
    from components.agent.table1 import method_row

    by = {m: [r for r in rows if r["method"] == m] for m in (POLICY, RANDOM)}
    table = {
        m: method_row(by[m], real_steps=None, sft=None, random=by[RANDOM] if m == POLICY else None)
        for m in (POLICY, RANDOM)
    }
    for row in table.values():
        if row is not None:
            row.pop("real_steps", None)  # Table 1's training cost: unknown for any policy here
    return table


def markdown(table: dict[str, Any], about: dict[str, Any]) -> str:
    """The success table as markdown, the policy's row first."""
    from components.agent.table1 import diff_cell, greedy_cell, success_cell

    lines = [
        f"### {about['policy']} on {about['n_tasks']} external tasks ({about['env']})",
        "",
        "Success %, sampled (greedy beside it when run); 95% CIs by bootstrap over seeds and "
        "tasks; the difference from random is paired on the same tasks and seeds.",
        "",
        "| method | success % (95% CI) | greedy % | vs random (95% CI) | episodes | tasks "
        "| seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    labels = {POLICY: f"policy ({about['policy']})", RANDOM: "Random (admissible)"}
    for method, r in table.items():
        if r is None:
            lines.append(f"| {labels[method]} | not evaluated | | | | | |")
            continue
        lines.append(
            f"| {labels[method]} | {success_cell(r)} | {greedy_cell(r)} "
            f"| {diff_cell(r.get('vs_random'))} | {r['episodes']} | {r['tasks']} | {r['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def evaluate_external(
    cfg: Config,
    paths: Paths,
    policy: str,
    out: Path,
    games: list[str] | None = None,
    tasks: list[str] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Command evaluate-external: a policy and the random baseline on external tasks."""
    import json

    from components import manifest
    from components.envs.external import QUARANTINE_FILE, ExternalTasksError, quarantine_text
    from components.io import atomic_write_text
    from components.tracking import run_provenance, stage_run

    start = time.perf_counter()
    out = Path(out)
    names = (SUCCESS_JSON, SUCCESS_MD, EPISODES_FILE, QUARANTINE_FILE)
    found = external_tasks(cfg, list(games or []), list(tasks or []), paths.root)
    manifest.claim(out, names, force=force, what=COMMAND)  # before any slow work
    atomic_write_text(out / QUARANTINE_FILE, quarantine_text(found.quarantined))
    manifest.record(out, [QUARANTINE_FILE])
    if not found.tasks:
        raise ExternalTasksError(f"no usable task: the reasons are in {out / QUARANTINE_FILE}")
    with tempfile.TemporaryDirectory(prefix="dreamgym-policy-") as scratch:
        dirs, about = resolve_policy(policy, paths, Path(scratch))
        data = {f"games_{i}": Path(g) for i, g in enumerate(games or []) if Path(g).exists()}
        data |= {f"tasks_{i}": Path(t) for i, t in enumerate(tasks or [])}
        with stage_run(
            "evaluate_external", "agent", cfg, ("agent", "env"), paths.root, data
        ) as run:
            rows = play(cfg, paths, dirs, found.tasks)
            table = success_table(rows)
            result = {
                **about,
                "env": cfg.env.name,
                "n_tasks": len(found.tasks),
                "n_quarantined": len(found.quarantined),
                "sources": {"games": list(games or []), "tasks": list(tasks or [])},
                "table": table,
                "eval_seconds": round(time.perf_counter() - start, 2),
                "_provenance": run_provenance(paths.root, cfg.profile, cfg.env.name),
            }
            text = markdown(table, result)
            write_json(out / SUCCESS_JSON, result)
            atomic_write_text(out / SUCCESS_MD, text)
            atomic_write_text(
                out / EPISODES_FILE, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
            )
            manifest.record(out, names)
            run.set_tags({"policy": policy, **about})
            run.log_metrics({m: numbers(r) for m, r in table.items() if r is not None})
            run.log_metrics({"n_tasks": len(found.tasks), "n_quarantined": len(found.quarantined)})
            for name in names:
                run.log_artifact(out / name, "external")
    log.info("external evaluation -> %s\n%s", out, text)
    return {**numbers(result), "out": str(out), "table": table}
