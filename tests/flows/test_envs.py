"""The per-env flow: workspaces, the task-runner switch, and one real run on Dask.

The run is real Prefect (the test harness server), a real ``DaskTaskRunner`` on a
``LocalCluster`` of two worker processes, real git worktrees and real ``dvc repro`` in
each, on a toy dvc.yaml whose first stage waits for the other env's: the two env pipelines must
overlap in time, each in its own workspace with its own params, the project untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.config import ConfigError, OrchestrationConfig, load_config
from flows.workspaces import WorkspaceError, prepare_workspace, set_params

ROOT = Path(__file__).resolve().parents[2]
ENVS = ["textworld", "scienceworld"]
# a rendezvous, not a sleep: each env's first stage waits (up to 120 s) until every env's
# has started, so parallel pipelines overlap however loaded the machine, serial ones do not
STAMP = """\
import glob, json, os, time, yaml
env = yaml.safe_load(open("params.yaml"))["env"]["name"]
start = time.time()
open(os.path.join("..", ".started-" + env), "w").close()  # the workspaces' folder
while len(glob.glob(os.path.join("..", ".started-*"))) < 2 and time.time() - start < 120:
    time.sleep(0.1)
os.makedirs("out", exist_ok=True)
json.dump({"env": env, "start": start, "end": time.time()}, open("out/hello.json", "w"))
"""
TABLE = """\
import json, os, yaml
env = yaml.safe_load(open("params.yaml"))["env"]["name"]
row = {"success": 0.5, "ci_low": 0.25, "ci_high": 0.75, "episodes": 4, "seeds": 1,
       "real_steps": None}
os.makedirs("metrics", exist_ok=True)
json.dump({env: {"sft": row}, "_provenance": {"env": env}, "_headline": "sampled"},
          open("metrics/table1.json", "w"))
"""
TOY_DVC = {
    "stages": {
        "hello": {
            "cmd": "python stamp.py",
            "deps": ["stamp.py"],
            "params": ["env.name"],
            "outs": ["out/hello.json"],
        },
        "twice": {
            "cmd": "python -c \"import json; d = json.load(open('out/hello.json')); "
            "open('out/twice.txt', 'w').write(d['env'] * 2)\"",
            "deps": ["out/hello.json"],
            "outs": ["out/twice.txt"],
        },
        "table1": {  # each workspace's rows: the flow merges them into the project's
            "cmd": "python table.py",
            "deps": ["table.py", "out/twice.txt"],
            "outs": [{"metrics/table1.json": {"cache": False}}],
        },
    }
}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def toy_project(tmp_path: Path) -> Path:
    """A committed git + DVC project: the real params.yaml (dask, two envs), a toy dvc.yaml."""
    root = tmp_path / "project"
    root.mkdir()
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["orchestration"].update(task_runner="dask", envs=ENVS, dask_workers=2)
    (root / "params.yaml").write_text("# toy project\n" + yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.yaml").write_text(yaml.safe_dump(TOY_DVC, sort_keys=False))
    (root / "stamp.py").write_text(STAMP)
    (root / "table.py").write_text(TABLE)
    (root / ".gitignore").write_text("/.workspaces/\n/mlflow.db\n/mlruns/\n")
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "test@example.com")
    _git(root, "config", "user.name", "test")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "toy")
    return root


# -- workspaces and the switch (no Prefect) ---------------------------------------------------


def test_workspaces_are_worktrees_with_their_own_params_that_follow_head(toy_project: Path):
    ws = prepare_workspace(toy_project, Path(".workspaces/miniwob"), {"env.name": "miniwob"})
    assert ws == toy_project / ".workspaces" / "miniwob"
    assert _git(ws, "rev-parse", "HEAD") == _git(toy_project, "rev-parse", "HEAD")
    text = (ws / "params.yaml").read_text()
    assert (
        text.startswith("# toy project") and load_config(ws / "params.yaml").env.name == "miniwob"
    )
    assert load_config(toy_project / "params.yaml").env.name == "textworld"  # untouched
    # the workspace's own state survives HEAD moving on; new code arrives
    (ws / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (toy_project / "stamp.py").write_text(STAMP + "# v2\n")
    _git(toy_project, "commit", "-q", "-am", "v2")
    assert prepare_workspace(toy_project, Path(".workspaces/miniwob"), {}) == ws
    assert (ws / "stamp.py").read_text().endswith("# v2\n")
    assert (ws / "dvc.lock").read_text().startswith("schema: '2.0'")
    assert _git(toy_project, "status", "--porcelain") == ""  # ignored by the project's git

    (toy_project / ".workspaces" / "stray").mkdir()
    (toy_project / ".workspaces" / "stray" / "x").write_text("x")
    with pytest.raises(WorkspaceError, match="not a git worktree"):
        prepare_workspace(toy_project, Path(".workspaces/stray"), {})


def test_bad_overrides_name_the_key(toy_project: Path, tmp_path: Path):
    src, dst = toy_project / "params.yaml", tmp_path / "params.yaml"
    with pytest.raises(ConfigError, match=r"env\.name"):
        set_params(src, dst, {"env.name": "nethack"})
    with pytest.raises(WorkspaceError, match="not a section"):
        set_params(src, dst, {"nope.name": 1})


def _worktrees(root: Path) -> list[str]:
    return [
        line
        for line in _git(root, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


def test_bad_params_are_refused_before_any_worktree_is_created(toy_project: Path):
    with pytest.raises(ConfigError, match=r"env\.name") as err:
        prepare_workspace(toy_project, Path(".workspaces/nosuchenv"), {"env.name": "nosuchenv"})
    # one line about the overrides, not advice to `git checkout` a generated params.yaml
    assert "\n" not in str(err.value) and "git checkout" not in str(err.value)
    assert "params.yaml with env.name='nosuchenv'" in str(err.value)
    assert not (toy_project / ".workspaces").exists()
    assert len(_worktrees(toy_project)) == 1  # the project's own checkout only
    # an existing workspace keeps its params.yaml when the new ones are bad
    ws = prepare_workspace(toy_project, Path(".workspaces/miniwob"), {"env.name": "miniwob"})
    before = (ws / "params.yaml").read_text()
    with pytest.raises(ConfigError, match=r"agent\.seeds"):
        prepare_workspace(toy_project, Path(".workspaces/miniwob"), {"agent.seeds": "oops"})
    assert (ws / "params.yaml").read_text() == before


def test_an_unknown_env_or_stage_is_refused_before_any_workspace(toy_project: Path):
    from flows.envs import check_request, envs_pipeline

    known = "known: textworld, scienceworld, miniwob, webshop, alfworld, webarena"
    with pytest.raises(ConfigError, match=f"unknown env 'nosuchenv'; {known}"):
        check_request(toy_project, ["textworld", "nosuchenv"], None, {})
    with pytest.raises(ConfigError, match="an env is listed twice: textworld"):
        check_request(toy_project, ["textworld", "textworld"], None, {})
    with pytest.raises(ConfigError, match=r"unknown stages \['nope'\]; dvc.yaml has"):
        check_request(toy_project, None, ["hello", "nope"], {})
    with pytest.raises(ConfigError, match="profile"):
        check_request(toy_project, None, None, {"profile": "huge"})
    assert check_request(toy_project, None, ["table1"], {"profile": "ci"}) == ENVS
    # the flow itself refuses them too (a deployment or a Python caller), before its logger
    with pytest.raises(ConfigError, match="unknown env 'nosuchenv'"):
        envs_pipeline.fn(root=str(toy_project), envs=["nosuchenv"])
    assert not (toy_project / ".workspaces").exists() and len(_worktrees(toy_project)) == 1


def _no_prefect_env(tmp_path: Path) -> dict[str, str]:
    """A subprocess environment in which a flow run could not start (no server to reach)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect-home"))
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # discard port: refused at once
    return env


def test_the_command_refuses_an_unknown_env_in_one_line_exit_2(toy_project: Path, tmp_path):
    cmd = [sys.executable, "-m", "flows.envs", "--root", str(toy_project), "--env", "nosuchenv"]
    proc = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=_no_prefect_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: unknown env 'nosuchenv'; "
        "known: textworld, scienceworld, miniwob, webshop, alfworld, webarena"
    ]
    assert not (toy_project / ".workspaces").exists()
    assert len(_worktrees(toy_project)) == 1


def test_the_command_refuses_bad_stages_and_params_in_one_line(toy_project: Path, capsys):
    from flows.envs import main

    root = ["--root", str(toy_project)]
    for args, expected in [
        (["--stage", "nope"], "error: unknown stages ['nope']; dvc.yaml has"),
        (["--profile", "huge"], "error: profile: unknown profile 'huge'; known:"),
        (["--set", "agent.seeds=oops"], "error: invalid configuration (params.yaml with"),
        (["--set", "nope.x=1"], "error: nope.x: 'nope' is not a section of params.yaml"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(root + args)
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), (args, lines)
        assert exit_.value.code == (1 if "not a section" in expected else 2)
    assert not (toy_project / ".workspaces").exists() and len(_worktrees(toy_project)) == 1


def test_the_task_runner_switch():
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    from flows.envs import make_task_runner

    orch = OrchestrationConfig()
    assert orch.task_runner == "sequential"  # the default: nothing runs in parallel
    sequential = make_task_runner(orch)
    assert isinstance(sequential, ThreadPoolTaskRunner) and sequential._max_workers == 1
    local = make_task_runner(orch, "dask")
    assert isinstance(local, DaskTaskRunner) and local.cluster_kwargs["n_workers"] == 2
    remote = make_task_runner(orch.model_copy(update={"dask_address": "tcp://10.0.0.2:8786"}))
    assert isinstance(remote, ThreadPoolTaskRunner)  # the address alone does not switch
    remote = make_task_runner(
        orch.model_copy(update={"task_runner": "dask", "dask_address": "tcp://10.0.0.2:8786"})
    )
    assert remote.address == "tcp://10.0.0.2:8786"
    with pytest.raises(ValueError, match="unknown task runner 'ray'"):
        make_task_runner(orch, "ray")
    for profile in ("ci", "cpu", "gpu"):
        assert load_config(ROOT / "params.yaml", profile).orchestration.task_runner == "sequential"


def test_archive_env_run_copies_the_envs_rows_into_the_project(tmp_path: Path):
    from prefect.logging import disable_run_logger

    from flows.envs import archive_env_run

    root, ws = tmp_path / "project", tmp_path / "ws"
    (root / "metrics").mkdir(parents=True)
    (ws / "metrics").mkdir(parents=True)
    row = {"success": 0.5, "ci_low": 0.25, "ci_high": 0.75, "episodes": 4, "seeds": 1}
    project = {"miniwob": {"sft": {**row, "real_steps": 7}}, "_provenance": {"env": "miniwob"}}
    target, md = root / "metrics" / "table1.json", root / "metrics" / "table1.md"
    target.write_text(json.dumps(project))
    with disable_run_logger():
        # no workspace table, or none of this env's rows: the project's file is left alone
        assert archive_env_run.fn("textworld", str(ws), str(root)) is False
        (ws / "metrics" / "table1.json").write_text(json.dumps({"scienceworld": {}}))
        assert archive_env_run.fn("textworld", str(ws), str(root)) is False
        assert json.loads(target.read_text()) == project and not md.exists()
        assert not (root / "reports").exists()

        fresh = {
            "textworld": {"sft": {**row, "real_steps": None}},
            "_provenance": {"env": "textworld", "git_commit": "new"},
        }
        (ws / "metrics" / "table1.json").write_text(json.dumps({**project, **fresh}))
        assert archive_env_run.fn("textworld", str(ws), str(root)) is True
        merged = json.loads(target.read_text())
        assert merged["textworld"] == fresh["textworld"] and merged["miniwob"] == project["miniwob"]
        assert merged["_provenance_by_env"] == {
            "miniwob": {"env": "miniwob"},
            "textworld": {"env": "textworld", "git_commit": "new"},
        }
        assert merged["_provenance"] == {"env": "miniwob"}  # the project's own env's run
        assert "### miniwob" in md.read_text() and "### textworld" in md.read_text()
        names = sorted(p.name for p in (root / "metrics").iterdir())
        assert names == ["table1.json", "table1.md"]  # no temporary file left
        archived = root / "reports" / "envs" / "textworld"
        assert json.loads((archived / "table1.json").read_text()) == {**project, **fresh}

        target.write_text("{not json")
        with pytest.raises(ValueError, match=r"table1\.json: not valid JSON .*fix or delete it"):
            archive_env_run.fn("textworld", str(ws), str(root))
        assert target.read_text() == "{not json"


# -- one real run ---------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_env_pipelines_run_in_parallel_on_dask_in_their_own_workspaces(
    toy_project: Path, prefect_harness
):
    from flows.envs import envs_pipeline

    with pytest.raises(ValueError, match="unknown stages"):
        envs_pipeline(root=str(toy_project), stages=["nope"])

    # the project's Table 1 already holds another env's rows: they must survive the merges
    other = {"miniwob": {"sft": None}, "_provenance": {"env": "miniwob"}}
    (toy_project / "metrics").mkdir()
    (toy_project / "metrics" / "table1.json").write_text(json.dumps(other))

    results = envs_pipeline(root=str(toy_project), promote=False)  # params: dask, both envs
    assert sorted(results) == sorted(ENVS)
    stamps = {}
    for env, result in results.items():
        ws = Path(result["workspace"])
        assert ws == toy_project / ".workspaces" / env
        assert result["stages"] == ["hello", "twice", "table1"]
        stamps[env] = json.loads((ws / "out" / "hello.json").read_text())
        assert stamps[env]["env"] == env and (ws / "out" / "twice.txt").read_text() == env * 2
        assert "hello" in yaml.safe_load((ws / "dvc.lock").read_text())["stages"]
        assert (ws / "mlflow.db").exists()  # the env's MLflow runs stay in its workspace
        assert not result["worker"].endswith(f":{os.getpid()}")  # a Dask worker process ran it
    assert len({r["worker"] for r in results.values()}) == 2
    # both envs' first stages ran at the same time: the pipelines overlapped
    assert max(s["start"] for s in stamps.values()) < min(s["end"] for s in stamps.values())
    assert not (toy_project / "out").exists() and not (toy_project / "dvc.lock").exists()
    # the seeded Table 1 and the envs' archived runs
    assert _git(toy_project, "status", "--porcelain").splitlines() == ["?? metrics/", "?? reports/"]
    assert sorted(p.name for p in (toy_project / "reports" / "envs").iterdir()) == sorted(ENVS)
    # each env's rows were merged into the project's Table 1, the other env's kept
    table = json.loads((toy_project / "metrics" / "table1.json").read_text())
    assert {k for k in table if not k.startswith("_")} == {"miniwob", *ENVS}
    assert table["miniwob"] == {"sft": None}
    assert all(table[env]["sft"]["success"] == 0.5 for env in ENVS)
    assert table["_provenance_by_env"] == {e: {"env": e} for e in ["miniwob", *ENVS]}
    md = (toy_project / "metrics" / "table1.md").read_text()
    assert all(f"### {e}" in md for e in ["miniwob", *ENVS])

    # the switch as a flow parameter: sequential, and DVC finds both workspaces up to date
    again = envs_pipeline(root=str(toy_project), task_runner="sequential", promote=False)
    for env, result in again.items():
        ws = Path(result["workspace"])
        assert json.loads((ws / "out" / "hello.json").read_text()) == stamps[env]
        assert result["worker"].endswith(f":{os.getpid()}")  # in the flow's own process


def test_a_set_wins_over_the_env_and_profile_overlays(tmp_path: Path):
    # the project's own params.yaml: its env_overrides and profiles set these keys, and
    # load_config merges them over the top level, so a top-level --set was silently lost
    src, dst = Path(__file__).resolve().parents[2] / "params.yaml", tmp_path / "params.yaml"
    sw = {"env.name": "scienceworld", "rl.dreamgym_iterations": 10, "rl.grpo.sft_coef": 0.5}
    set_params(src, dst, sw)
    cfg = load_config(dst)
    assert cfg.rl.dreamgym_iterations == 10 and cfg.rl.grpo.sft_coef == 0.5
    assert cfg.rl.grpo.tasks_per_iteration == 4  # what the --set did not name stays
    set_params(src, dst, {"profile": "ci", "rl.grpo.iterations": 10, "agent.seeds": [0, 1]})
    cfg = load_config(dst)
    assert cfg.rl.grpo.iterations == 10 and cfg.agent.seeds == (0, 1)
