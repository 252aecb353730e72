"""Per-env pipelines side by side: one workspace per env, one after the other or on Dask.

``envs_pipeline`` prepares one workspace per env (flows/workspaces.py: a git worktree of
the project's HEAD whose params.yaml sets ``env.name``), then runs each env's DVC stages
in its workspace as one Prefect task, submitted to the task runner that
``orchestration.task_runner`` (or the flow's ``task_runner`` parameter) names:

- ``sequential`` (the default): a one-thread pool, one env pipeline after the other;
- ``dask``: prefect-dask's ``DaskTaskRunner``, every env pipeline a task on a Dask
  ``LocalCluster`` of ``orchestration.dask_workers`` processes on this machine, or on the
  scheduler at ``orchestration.dask_address`` (a multi-machine cluster whose workers see
  the same filesystem path).

Inside its task an env pipeline is exactly the ``pipeline`` flow's: ``dvc repro`` per
stage in dependency order, retries for the I/O-bound stages only (flows/stages.py
``IO_STAGES``), the ``accelerator`` tag on every other stage, training and evaluation
alike (a Prefect concurrency limit on that tag serialises them across envs), all under
one MLflow parent run in the workspace's own ``mlflow.db``.

Archive: as soon as an env pipeline that ran the ``table1`` stage has succeeded, the flow
(in its own process, one env at a time) archives that env's run into the project
(``components.evaluation.env_archive``, the ``dreamgym archive-env`` command): its files
under ``reports/envs/<env>/``, its rows merged into ``metrics/table1.json`` and
``metrics/policy_fidelity.json`` beside the other envs', and both ``.md`` files rewritten.

Seeds are not fanned out here: a stage trains or evaluates every seed itself, in
``agent.workers`` processes (components/stages/parallel.py), and writes one DVC output
per method for all of them (every seed's policy, one history, one metrics file); two
seeds of one stage cannot be two ``dvc repro`` runs without per-seed stages in dvc.yaml.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from components.config import (
    ENV_NAMES,
    PARAMS_FILE,
    TASK_RUNNERS,
    ConfigError,
    OrchestrationConfig,
    load_config,
)
from flows.cli import one_line_errors
from flows.pipeline import FIDELITY_STAGE, TABLE1_STAGE, _run, promote_experience_model
from flows.pipeline import promote_policy as _promote_policy
from flows.stages import DVC_FILE, stage_order
from flows.workspaces import git, prepare_workspace, render_params, uncommitted_code

ENV_KEY = "env.name"


def make_task_runner(orch: OrchestrationConfig, name: str | None = None) -> Any:
    """The Prefect task runner ``name`` (default ``orch.task_runner``) stands for."""
    name = name or orch.task_runner
    if name == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    if name != "dask":
        raise ValueError(f"unknown task runner {name!r}; known: {', '.join(TASK_RUNNERS)}")
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise RuntimeError("task runner dask needs prefect-dask: run `make setup`") from None
    if orch.dask_address:
        return DaskTaskRunner(address=orch.dask_address)
    # one thread per worker process: an env pipeline is one task, its stages are
    # subprocesses; no dashboard (no port to collide with, no bokeh needed)
    cluster = {"n_workers": orch.dask_workers, "threads_per_worker": 1, "processes": True}
    return DaskTaskRunner(cluster_kwargs={**cluster, "dashboard_address": None})


def head_stages(root: Path) -> list[str]:
    """The stages of HEAD's dvc.yaml (the one every workspace runs), in pipeline order."""
    with tempfile.TemporaryDirectory(prefix="dreamgym-dvc-") as tmp:
        (Path(tmp) / DVC_FILE).write_text(git(root, "show", f"HEAD:{DVC_FILE}"), encoding="utf-8")
        return stage_order(Path(tmp))


def check_request(
    root: Path,
    envs: Sequence[str] | None,
    stages: Sequence[str] | None,
    sets: Mapping[str, Any],
) -> list[str]:
    """The envs to run (``envs``, default ``orchestration.envs``) once the request is valid:
    every env known and named once, every stage in HEAD's dvc.yaml, every workspace's
    params.yaml (the project's with ``sets`` and the env) valid. Otherwise a one-line
    ``ConfigError`` (or ``WorkspaceError``), and nothing is created: no worktree, no folder.
    """
    project = load_config(root / PARAMS_FILE)  # the project's own params.yaml first
    names = list(envs or project.orchestration.envs)
    unknown = [name for name in names if name not in ENV_NAMES]
    if unknown:
        shown = ", ".join(repr(name) for name in unknown)
        raise ConfigError(
            f"unknown env{'s' if len(unknown) > 1 else ''} {shown}; known: {', '.join(ENV_NAMES)}"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"an env is listed twice: {', '.join(twice)}")
    if stages:
        known = head_stages(root)
        wrong = sorted(set(stages) - set(known))
        if wrong:
            raise ConfigError(f"unknown stages {wrong}; dvc.yaml has {known}")
    for name in names:
        render_params(root / PARAMS_FILE, {**sets, ENV_KEY: name})
    return names


@task(name="env-pipeline", task_run_name="{env}")
def env_pipeline(
    env: str, workspace: str, stages: list[str] | None, force: bool, promote: bool
) -> dict[str, Any]:
    """One env's stages in its workspace, in order (``pipeline``'s ``_run``)."""
    ws = Path(workspace)
    ran = _run(f"pipeline-{env}", workspace, stages or stage_order(ws), force)
    if promote and FIDELITY_STAGE in ran:
        promote_experience_model(ws)
    if promote and TABLE1_STAGE in ran:
        _promote_policy(ws)
    where = f"{socket.gethostname()}:{os.getpid()}"  # which process (Dask worker) ran it
    return {"env": env, "workspace": workspace, "stages": ran, "worker": where}


@task(name="archive-env", task_run_name="{env}")
def archive_env_run(env: str, workspace: str, root: str) -> bool:
    """Archive ``env``'s run in its workspace into the project (reports/envs/<env>/, its rows
    in metrics/table1.json and policy_fidelity.json); False (a warning, nothing written)
    when the workspace has no Table 1 rows for ``env``."""
    from components.evaluation.env_archive import TABLE1, archive_env, read_json_object

    found = read_json_object(Path(workspace) / TABLE1)
    if found is None or not isinstance(found.get(env), dict):
        why = "missing" if found is None else f"has no rows for {env}"
        where = Path(workspace) / TABLE1
        get_run_logger().warning("%s %s: the project's Table 1 is left as it is", where, why)
        return False
    done = archive_env(Path(workspace), Path(root), env=env)
    get_run_logger().info(
        "env %s: archived to %s; merged into %s", env, done.folder, ", ".join(done.merged)
    )
    return True


@flow(name="envs-fan-out")
def run_envs(
    workspaces: dict[str, str],
    stages: list[str] | None,
    force: bool,
    promote: bool,
    root: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Submit every env pipeline to this flow's task runner; wait for all of them. With
    ``root``, each successful env pipeline that ran the table1 stage is archived into
    ``root`` (``archive_env_run``), one env after the other in this process."""
    futures = {
        env: env_pipeline.submit(env, ws, stages, force, promote) for env, ws in workspaces.items()
    }
    env_of = {id(future): env for env, future in futures.items()}
    done: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    # every env pipeline is awaited: one env failing does not abandon the others mid-stage
    for future in as_completed(list(futures.values())):
        env = env_of[id(future)]
        try:
            done[env] = result = future.result()
        except Exception as err:
            failed.append(f"{env}: {str(err).strip().splitlines()[-1] if str(err) else err!r}")
            continue
        if root is not None and TABLE1_STAGE in result["stages"]:
            try:  # as soon as this env is done, not after the slowest one
                archive_env_run(env, result["workspace"], root)
            except Exception as err:  # e.g. the project's table1.json is not valid JSON
                failed.append(f"{env}: archiving its run: {err}")
    if failed:
        raise RuntimeError(f"env pipelines failed ({'; '.join(failed)})")
    return {env: done[env] for env in futures}


@flow(name="envs", log_prints=True)
def envs_pipeline(
    root: str = ".",
    envs: list[str] | None = None,
    stages: list[str] | None = None,
    force: bool = False,
    profile: str | None = None,
    overrides: dict[str, Any] | None = None,
    task_runner: str | None = None,
    promote: bool = True,
) -> dict[str, dict[str, Any]]:
    """The pipeline (or ``stages``) once per env of ``envs`` (default:
    ``orchestration.envs``), each in its own workspace; returns per env what ran where.

    ``profile`` and ``overrides`` (dotted keys, e.g. ``{"agent.seeds": [0]}``) go into
    every workspace's params.yaml; ``task_runner`` overrides ``orchestration.task_runner``.
    """
    root_path = Path(root).resolve()
    orch = load_config(root_path / PARAMS_FILE).orchestration
    sets = {**({"profile": profile} if profile else {}), **(overrides or {})}
    # an unknown env, stage or parameter is refused before any workspace is created
    names = check_request(root_path, envs, stages, sets)
    runner = make_task_runner(orch, task_runner)
    logger = get_run_logger()
    unsaved = uncommitted_code(root_path)
    if unsaved:
        logger.warning("the workspaces run HEAD's code, without your changes to %s", unsaved[:5])
    workspaces: dict[str, str] = {}
    for env in names:  # before fanning out: git locks its worktree list
        ws = prepare_workspace(root_path, Path(orch.workspaces) / env, {**sets, ENV_KEY: env})
        workspaces[env] = str(ws)
        logger.info("env %s: workspace %s", env, ws)
    logger.info("task runner: %s", task_runner or orch.task_runner)
    with _api_for_workers():
        return run_envs.with_options(task_runner=runner)(
            workspaces, stages, force, promote, str(root_path)
        )


def _api_for_workers() -> Any:
    """Without a Prefect server (``PREFECT_API_URL`` unset) a flow runs on a temporary one in
    its own process: hand its URL to the tasks, or every Dask worker would start its own
    and record the env pipelines where the flow's run never sees them."""
    from contextlib import nullcontext

    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ctx = FlowRunContext.get()
    if PREFECT_API_URL.value() or ctx is None:
        return nullcontext()
    return temporary_settings({PREFECT_API_URL: str(ctx.client.api_url).rstrip("/")})


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``python -m flows.envs [--env E ...] [--task-runner dask] [--stage S ...] ...``

    An unknown env, stage or parameter ends it with one ``error:`` line and exit code 2
    before any Prefect run or workspace (flows/cli.py)."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.envs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--root", default=".", help="project root (default: .)")
    parser.add_argument(
        "--env",
        action="append",
        help=f"an env (repeatable; default: orchestration.envs): {', '.join(ENV_NAMES)}",
    )
    parser.add_argument("--stage", action="append", help="a dvc.yaml stage (repeatable; all)")
    parser.add_argument("--task-runner", choices=TASK_RUNNERS, help="orchestration.task_runner")
    parser.add_argument("--profile", help="the workspaces' profile (ci, cpu, gpu)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a param (YAML value)"
    )
    parser.add_argument("--force", action="store_true", help="rerun the stages even if fresh")
    parser.add_argument("--no-promote", action="store_true", help="skip the promotion rules")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        try:
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            parser.error(f"--set {item!r}: not a YAML value ({str(err).splitlines()[0]})")
    sets = {**({"profile": args.profile} if args.profile else {}), **overrides}
    with one_line_errors():
        check_request(Path(args.root).resolve(), args.env, args.stage, sets)
        return envs_pipeline(
            root=args.root,
            envs=args.env,
            stages=args.stage,
            force=args.force,
            profile=args.profile,
            overrides=overrides,
            task_runner=args.task_runner,
            promote=not args.no_promote,
        )


if __name__ == "__main__":
    main()
