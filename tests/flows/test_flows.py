"""Prefect flow wiring: families and order against dvc.yaml and DVC's own graph, one real run.

The real run is a Prefect flow (test harness server) running ``dvc repro`` of the cheap
``report`` stage in a scratch DVC project: real DVC, the real ``dreamgym report`` command,
real MLflow on SQLite, with the stage run nested under the flow's pipeline run.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.tracking import PARENT_RUN_ENV
from flows.pipeline import NIGHTLY_FAMILIES
from flows.stages import (
    FAMILIES,
    IO_STAGES,
    family_stages,
    repro_command,
    stage_env,
    stage_order,
    with_upstream,
)
from tests.procs import alive

ROOT = Path(__file__).resolve().parents[2]


def dvc_stages(root: Path) -> list[str]:
    return list(yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"])


def test_every_dvc_stage_belongs_to_exactly_one_family():
    members = [s for stages in FAMILIES.values() for s in stages]
    assert len(members) == len(set(members)), "a stage is in two families"
    missing = set(dvc_stages(ROOT)) - set(members)
    assert not missing, f"dvc.yaml stages no flow runs: {sorted(missing)}"
    assert set(members) >= IO_STAGES


def test_stage_order_is_a_topological_order_of_dvcs_own_graph():
    from dvc.repo import Repo

    order = stage_order(ROOT)
    assert sorted(order) == sorted(dvc_stages(ROOT))
    position = {name: i for i, name in enumerate(order)}
    with Repo(str(ROOT)) as repo:
        edges = [(u.addressing, v.addressing) for u, v in repo.index.graph.edges]
    assert edges, "DVC found no dependency between stages"
    for stage, upstream in edges:  # an edge points from a stage to what it depends on
        a, b = stage.split("@")[0], upstream.split("@")[0]
        if a != b:
            assert position[b] < position[a], f"{b} must run before {a}"


def test_order_follows_dependencies_expands_foreach_and_rejects_cycles(tmp_path: Path):
    spec = {
        "stages": {
            # listed downstream first: the order must still put producers first
            "summary": {"cmd": "x", "deps": ["metrics/fit"]},
            "fit": {
                "foreach": ["a", "b"],
                "do": {
                    "cmd": "x",
                    "deps": ["data/clean/part.txt"],
                    "metrics": [{"metrics/fit/${item}.json": {"cache": False}}],
                },
            },
            "clean": {"cmd": "x", "deps": ["raw.txt"], "outs": ["data/clean"]},
            "unrelated": {"cmd": "x", "deps": ["other.txt"]},
        }
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert stage_order(tmp_path) == ["clean", "fit", "summary", "unrelated"]
    spec["stages"]["clean"]["deps"] = ["metrics/fit/a.json"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ValueError, match="cycle"):
        stage_order(tmp_path)


def test_a_subset_runs_with_its_upstream_stages_each_in_its_own_task(tmp_path: Path):
    # `dvc repro judge` alone would run stale training stages inside judge's I/O task
    spec = {
        "stages": {
            "summary": {"cmd": "x", "deps": ["metrics/fit"]},
            "fit": {"cmd": "x", "deps": ["data/clean"], "outs": ["metrics/fit"]},
            "clean": {"cmd": "x", "deps": ["raw.txt"], "outs": ["data/clean"]},
            "unrelated": {"cmd": "x", "deps": ["other.txt"]},
        }
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert with_upstream(tmp_path, ["summary"]) == ["clean", "fit", "summary"]
    assert with_upstream(tmp_path, ["unrelated", "fit"]) == ["clean", "fit", "unrelated"]
    order = stage_order(ROOT)
    judge = with_upstream(ROOT, ["judge"])
    assert judge[-1] == "judge" and judge == [s for s in order if s in judge]
    assert {"collect", "train_experience_model"} <= set(judge)


def test_family_flows_and_nightly_refresh_select_stages_in_pipeline_order():
    order = stage_order(ROOT)
    for family in FAMILIES:
        stages = family_stages(ROOT, family)
        assert stages == [s for s in order if s in FAMILIES[family]]
    evaluation = ["judge", "drift", "theorem1", "policy_fidelity", "report"]
    assert family_stages(ROOT, "evaluation")[-5:] == evaluation
    nightly = [s for f in NIGHTLY_FAMILIES for s in family_stages(ROOT, f)]
    assert nightly == [s for s in order if s in nightly]  # data before the experience model
    assert {"collect", "build_buffer", "train_experience_model", "evaluate_fidelity"} <= set(
        nightly
    )
    with pytest.raises(ValueError, match="unknown family"):
        family_stages(ROOT, "nope")


def test_only_io_bound_stages_retry_and_every_other_stage_is_tagged_accelerator():
    from flows.stages import ACCELERATOR_TAG, stage_task

    # theorem1 and policy_fidelity run local models on the simulators, as evaluate_policy
    # does: compute-bound, a retry would only repeat a deterministic failure
    assert {"generate_tasks", "collect", "annotate", "judge"} == IO_STAGES
    for stage in dvc_stages(ROOT):
        runner = stage_task(stage)
        if stage in IO_STAGES:
            assert runner.retries == 2 and ACCELERATOR_TAG not in runner.tags, stage
        else:
            assert runner.retries == 0 and ACCELERATOR_TAG in runner.tags, stage
    # docs/orchestration.md lists exactly the stages that retry
    text = " ".join((ROOT / "docs" / "orchestration.md").read_text(encoding="utf-8").split())
    listed = re.search(r"the stages that retry \(([^)]*)\)", text)
    assert listed is not None and set(re.findall(r"`(\w+)`", listed.group(1))) == IO_STAGES


def test_annotate_and_judge_retry_only_when_an_api_answers_them():
    from components.config import load_config
    from flows.stages import ACCELERATOR_TAG, stage_task

    # the default grounded teacher and judge compute in the stage's own process
    config = load_config(ROOT / "params.yaml")
    assert (config.teacher.backend, config.judge.backend) == ("grounded", "grounded")
    for stage in ("annotate", "judge"):
        assert ACCELERATOR_TAG in stage_task(stage, config).tags
    served = config.model_copy(
        update={
            "teacher": config.teacher.model_copy(update={"backend": "openai"}),
            "judge": config.judge.model_copy(update={"backend": "openai"}),
        }
    )
    for stage in ("annotate", "judge"):
        assert stage_task(stage, served).retries == 2
    assert stage_task("collect", config).retries == 2  # an env stays I/O whatever the backends


def test_repro_command_and_stage_environment(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    assert repro_command("judge", force=False)[1:] == ["-m", "dvc", "repro", "judge"]
    assert repro_command("judge", force=True)[-3:] == ["--force", "--single-item", "judge"]
    env = stage_env("abc123")
    # a worker started without the venv on PATH still finds `dreamgym` for DVC's cmd
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env[PARENT_RUN_ENV] == "abc123"
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    assert PARENT_RUN_ENV not in stage_env(None)


# -- one real flow run ------------------------------------------------------------------------

REPORT_INPUTS = {
    "data.json": {"n_trajectories": 12, "n_transitions": 80, "n_games": {"train": 2}},
    "fidelity.json": {"full": {"n": 10, "eps_R": 0.1, "state_token_f1": 0.5}},
    "table1.json": {
        "textworld": {
            "sft": {"success": 0.5, "ci_low": 0.2, "ci_high": 0.8, "episodes": 8, "seeds": 1},
            "dpo": None,
        }
    },
    "judge.json": {"full": {"consistency": 1.5, "n": 4}},
    "drift.json": {"dreamgym_grpo": {"drifted": False, "iter_0": {"drift_share": 0.2}}},
}


@pytest.fixture
def scratch_project(tmp_path: Path) -> Path:
    """dvc.yaml, params (ci), the report's code and its input metrics in a fresh DVC repo."""
    dest = tmp_path / "project"
    dest.mkdir()
    shutil.copytree(
        ROOT / "components", dest / "components", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(ROOT / "dvc.yaml", dest / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["profile"] = "ci"
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    report = yaml.safe_load((dest / "dvc.yaml").read_text())["stages"]["report"]
    for dep in report["deps"]:
        path = dest / dep
        if dep.startswith("metrics/"):
            path.parent.mkdir(parents=True, exist_ok=True)
            if dep.endswith(".jsonl"):
                row = {"iteration": 1, "success_rate": 0.25, "real_steps": 0}
                path.write_text(json.dumps(row) + "\n")
            else:
                path.write_text(json.dumps(REPORT_INPUTS.get(path.name, {})))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=dest, check=True)
    return dest


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_pipeline_flow_runs_a_real_dvc_stage_nested_under_its_mlflow_run(
    scratch_project: Path, prefect_harness
):
    import mlflow

    from flows.pipeline import pipeline

    with pytest.raises(ValueError, match="unknown stages"):
        pipeline(root=str(scratch_project), stages=["no_such_stage"])

    # The plain call returns the flow's in-memory value; `return_state=True` + `state.result()`
    # can hand back the server's copy of the Completed state, which has no data (MissingResult
    # on a loaded CI machine, stop 39).
    assert pipeline(root=str(scratch_project), stages=["report"], force=True) == ["report"]
    text = (scratch_project / "reports" / "report.md").read_text()
    assert "| SFT | 50.0 | [20.0, 80.0] | n/a |  |  |  |  | 8 | 1 |" in text
    outs = yaml.safe_load((scratch_project / "dvc.yaml").read_text())["stages"]["report"]["outs"]
    for out in outs:  # every output DVC expects was written (placeholders included)
        assert (scratch_project / out).is_file(), out
    lock = yaml.safe_load((scratch_project / "dvc.lock").read_text())
    assert "report" in lock["stages"]

    mlflow.set_tracking_uri(f"sqlite:///{scratch_project / 'mlflow.db'}")
    runs = {
        r.info.run_name: r
        for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
    }
    parent, child = runs["pipeline"], runs["report"]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    # same experiment: the MLflow UI shows the stage nested under the pipeline run
    assert child.info.experiment_id == parent.info.experiment_id
    assert child.data.tags["family"] == "evaluation" and child.data.params["profile"] == "ci"
    assert parent.info.status == child.info.status == "FINISHED"


# -- prefect.yaml -----------------------------------------------------------------------------


def test_prefect_yaml_deployments_load_and_their_schedules_create_runs(prefect_harness):
    """Every deployment's flow loads; the server turns each schedule into scheduled runs.

    POST /deployments/{id}/schedule runs the scheduler service's own insert path (it failed
    with SQLAlchemy 2.1: no scheduled run was ever created).
    """
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.asyncutils import run_coro_as_sync

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    pull = spec["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert pull["directory"] == "{{ $DREAMGYM_ROOT }}"
    deployments = {d["name"]: d for d in spec["deployments"]}
    assert {"nightly-refresh", "weekly-full", "evaluation"} <= set(deployments)
    scheduled = 0
    for name, d in deployments.items():
        assert d["work_pool"]["name"] == "dreamgym-local"
        flow = load_flow_from_entrypoint(str(ROOT / d["entrypoint"]))
        schedules = [
            CronSchedule(cron=s["cron"], timezone=s["timezone"]) for s in d.get("schedules", [])
        ]
        dep_id = flow.to_deployment(
            name=name, parameters=d["parameters"], schedules=schedules or None
        ).apply()
        if not schedules:
            continue

        async def runs_of(dep_id=dep_id) -> list:
            async with get_client() as client:
                response = await client._client.post(f"/deployments/{dep_id}/schedule", json={})
                response.raise_for_status()
                return await client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep_id]))
                )

        runs = run_coro_as_sync(runs_of())
        assert len(runs) >= 3 and {r.state_name for r in runs} == {"Scheduled"}, name
        hour = int(d["schedules"][0]["cron"].split()[1])
        assert {r.expected_start_time.hour for r in runs} == {hour}, name
        scheduled += 1
    assert scheduled >= 2


def test_nightly_fresh_data_bumps_the_collection_round_keeping_comments(tmp_path: Path):
    from components.config import load_config
    from flows.pipeline import bump_collect_round

    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    assert bump_collect_round(tmp_path) == 1 and bump_collect_round(tmp_path) == 2
    text = (tmp_path / "params.yaml").read_text()
    assert "# DreamGym parameters." in text and "round: 2" in text
    assert load_config(tmp_path / "params.yaml", "ci").collect.round == 2


def test_a_night_that_failed_is_resumed_not_bumped_again(tmp_path: Path):
    """A bump drops the episodes the failed night had collected: the next night resumes
    its round; only a completed night's successor gets a new one."""
    from flows.pipeline import _write_night, night_round

    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    assert night_round(tmp_path) == 1  # no record: a new round
    assert night_round(tmp_path) == 1  # night 1 never completed: resumed
    _write_night(tmp_path, 1, completed=True)
    assert night_round(tmp_path) == 2
    (tmp_path / "params.yaml").write_text("seed: -1\n")  # invalid: refused before any edit
    with pytest.raises(Exception, match="seed"):
        night_round(tmp_path)
    assert (tmp_path / "params.yaml").read_text() == "seed: -1\n"


def test_a_cancelled_stage_task_stops_the_stage_command_too(monkeypatch, tmp_path: Path):
    # a Prefect cancel raises in the task while it streams `dvc repro`'s output: killing
    # `dvc repro` alone left the stage command it started running under PID 1
    import flows.stages as stages

    pid_file = tmp_path / "stage.pid"
    script = f"sleep 60 & echo $! > {pid_file}; echo started; wait"
    monkeypatch.setattr(stages, "repro_command", lambda stage, force: ["bash", "-c", script])

    class Cancelled:
        def info(self, msg, *args):
            if msg == "started":  # the stage's first output line
                raise KeyboardInterrupt("cancelled")

    monkeypatch.setattr(stages, "get_run_logger", Cancelled)
    with pytest.raises(KeyboardInterrupt):
        stages._repro("judge", str(tmp_path), None)
    pid = int(pid_file.read_text())
    assert not alive(pid)  # a zombie PID 1 has not reaped yet counts as stopped


@pytest.mark.parametrize(
    ("command_exit", "retried"), [(2, False), (3, False), (1, True), (None, True)]
)
def test_an_io_stage_retries_transient_failures_only(monkeypatch, tmp_path, command_exit, retried):
    # a bad parameter (exit 2) or a spent budget (3) fails again: 70 s of retries for nothing
    from types import SimpleNamespace

    import flows.stages as stages

    said = f"echo 'ERROR: failed to run: x, exited with {command_exit}'; " if command_exit else ""
    script = f"{said}exit 255"
    monkeypatch.setattr(stages, "repro_command", lambda stage, force: ["bash", "-c", script])
    monkeypatch.setattr(stages, "get_run_logger", lambda: SimpleNamespace(info=lambda *a: None))
    with pytest.raises(stages.StageFailed) as failed:
        stages._repro("collect", str(tmp_path), None)
    assert failed.value.command_exit == command_exit
    state = SimpleNamespace(data=failed.value)
    assert stages.retry_transient(None, None, state) is retried
    assert stages.repro_io_stage.retry_condition_fn is stages.retry_transient
    # a Dask worker sends the failure back pickled: it must come back whole
    back = pickle.loads(pickle.dumps(failed.value))
    assert back.command_exit == command_exit and str(back) == str(failed.value)
