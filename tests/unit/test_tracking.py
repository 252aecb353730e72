"""Tracking: runs land in SQLite with params, code/data versions; secrets are redacted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from components.config import load_config
from components.tracking import (
    REDACTED,
    dvc_md5,
    ensure_store,
    flatten,
    pipeline_run,
    stage_run,
)

ROOT = Path(__file__).resolve().parents[2]


def test_flatten_redacts_secret_keys_but_not_env_var_names():
    flat = flatten({"teacher": {"api_key": "sk-live", "api_key_env": "OPENAI_API_KEY"}})
    assert flat["teacher.api_key"] == REDACTED
    assert flat["teacher.api_key_env"] == "OPENAI_API_KEY"


def test_a_token_is_secret_as_a_name_not_as_a_count_or_a_metric():
    # "token" anywhere redacted state_token_f1 (then dropped as a non-number) and max_tokens
    flat = flatten(
        {
            "teacher": {"hf_token": "hf_x", "access-token": "y", "max_tokens": 512},
            "full": {"state_token_f1": 0.78, "tokenizer": "gpt2", "prompt_tokens": 10},
        }
    )
    assert flat["teacher.hf_token"] == flat["teacher.access-token"] == REDACTED
    assert flat["teacher.max_tokens"] == 512 and flat["full.state_token_f1"] == 0.78
    assert flat["full.tokenizer"] == "gpt2" and flat["full.prompt_tokens"] == 10


def test_dvc_md5_of_file_and_directory(tmp_path: Path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("a")
    (tmp_path / "d" / "sub" / "b.txt").write_text("b")
    assert dvc_md5(tmp_path / "d" / "a.txt") == hashlib.md5(b"a").hexdigest()
    entries = [
        {"md5": hashlib.md5(b"a").hexdigest(), "relpath": "a.txt"},
        {"md5": hashlib.md5(b"b").hexdigest(), "relpath": "sub/b.txt"},
    ]
    expected = hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"
    assert dvc_md5(tmp_path / "d") == expected


def test_stage_run_logs_params_versions_metrics_nested_under_pipeline(tmp_path, monkeypatch):
    import mlflow

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    with pipeline_run(tmp_path, "pipeline", {"stages": ["ingest"]}) as parent_id:
        monkeypatch.setenv("DREAMGYM_PARENT_RUN_ID", parent_id)
        with stage_run("ingest", "data", cfg, ("ingest",), tmp_path, {"raw": data}) as run:
            run.log_metrics({"n": 3, "nested": {"rate": 0.5}, "label": "x"})
            run_id = run.run_id
    run = mlflow.get_run(run_id)
    assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert run.data.params["ingest.max_action_chars"] == str(cfg.ingest.max_action_chars)
    assert run.data.params["profile"] == "ci"
    assert run.data.tags["dvc.md5.raw"] == hashlib.md5(b"{}\n").hexdigest()
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert len(run.data.tags["mlflow.source.git.commit"]) in (40, len("unknown"))
    assert run.data.metrics == {"n": 3.0, "nested.rate": 0.5}
    # nested: in the parent's experiment (the UI nests runs within one experiment)
    assert run.info.experiment_id == mlflow.get_run(parent_id).info.experiment_id
    assert run.data.tags["family"] == "data"
    exp = mlflow.get_experiment(run.info.experiment_id)
    assert exp.name == "dreamgym-pipeline"
    assert exp.artifact_location.startswith((tmp_path / "mlruns").as_uri())


def test_stage_run_alone_goes_to_its_family_experiment(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("DREAMGYM_PARENT_RUN_ID", raising=False)
    cfg = load_config(ROOT / "params.yaml", profile="ci")
    with stage_run("ingest", "data", cfg, ("ingest",), tmp_path) as run:
        run_id = run.run_id
    run = mlflow.get_run(run_id)
    assert "mlflow.parentRunId" not in run.data.tags
    assert mlflow.get_experiment(run.info.experiment_id).name == "dreamgym-data"


def test_params_overrides_are_recorded_and_do_not_make_the_tree_dirty(tmp_path: Path):
    import subprocess

    from components.tracking import git_commit, git_tags, params_overrides

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "params.yaml").write_text("env:\n  name: textworld\nseed: 0\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    assert params_overrides(tmp_path) == {} and not git_commit(tmp_path)[1]
    (tmp_path / "params.yaml").write_text("env:\n  name: scienceworld\nseed: 0\n")  # exp run -S
    assert params_overrides(tmp_path) == {"env.name": "scienceworld"}
    assert git_commit(tmp_path)[1] and not git_commit(tmp_path, params_ok=True)[1]
    # the MLflow runs' tags judge it as the metrics' _provenance does (they disagreed)
    tags = git_tags(tmp_path)
    assert tags["git.dirty"] == "false" and "scienceworld" in tags["params.overrides"]
    (tmp_path / "code.py").write_text("x = 2\n")  # code is never an override
    assert git_commit(tmp_path, params_ok=True)[1] and git_tags(tmp_path)["git.dirty"] == "true"


def test_first_stages_started_together_share_one_whole_store(tmp_path: Path):
    # a half-built mlflow.db (a first stage killed, or two started, while MLflow created
    # its schema) failed every later stage; the store now appears whole or not at all
    import multiprocessing
    import sqlite3

    (tmp_path / ".mlflow.db.999999.tmp").write_text("a build killed midway")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=ensure_store, args=(tmp_path,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    tables = {
        name
        for (name,) in sqlite3.connect(tmp_path / "mlflow.db").execute(
            "select name from sqlite_master where type = 'table'"
        )
    }
    assert {"experiments", "runs", "registered_models", "model_versions"} <= tables
    assert not list(tmp_path.glob(".mlflow.db.*.tmp"))


def test_a_store_half_built_by_an_older_version_is_one_clear_line(tmp_path: Path):
    import sqlite3

    import mlflow
    import pytest

    from components.cli_process import _known_error
    from components.tracking import configure

    with sqlite3.connect(tmp_path / "mlflow.db") as db:  # MLflow stopped after one table
        db.execute("create table experiments (x int)")
    configure(tmp_path)
    with pytest.raises(Exception) as err:
        mlflow.search_experiments()
    code, message = _known_error(err.value)
    assert code == 1 and message.startswith("mlflow.db is half-built")


def test_a_store_of_an_older_mlflow_is_one_line_saying_how_to_upgrade(tmp_path: Path):
    import sqlite3

    import mlflow
    import pytest

    from components.cli_process import _known_error
    from components.tracking import configure

    ensure_store(tmp_path)
    with sqlite3.connect(tmp_path / "mlflow.db") as db:  # as an older MLflow left it
        db.execute("update alembic_version set version_num = '451aebb31d03'")
    configure(tmp_path)
    with pytest.raises(Exception) as err:
        mlflow.search_experiments()
    code, message = _known_error(err.value)
    assert code == 1 and "\n" not in message
    assert message.startswith("mlflow.db: ") and "mlflow db upgrade" in message


@pytest.mark.parametrize("damage", ["truncated", "not_sqlite"])
def test_a_damaged_store_is_one_line_saying_to_move_it_away(tmp_path: Path, damage: str):
    import mlflow

    from components.cli_process import _known_error
    from components.tracking import configure

    ensure_store(tmp_path)
    db = tmp_path / "mlflow.db"
    whole = db.read_bytes()
    # a disk that filled mid-copy, or another file written over it
    db.write_bytes(whole[: len(whole) // 3] if damage == "truncated" else b"not sqlite " * 500)
    configure(tmp_path)
    with pytest.raises(Exception) as err:
        mlflow.search_experiments()
    code, message = _known_error(err.value)
    assert code == 1 and "\n" not in message
    assert message.startswith("mlflow.db is not a readable SQLite database (")
    assert "mv mlflow.db mlflow.db.broken" in message and "SELECT" not in message
