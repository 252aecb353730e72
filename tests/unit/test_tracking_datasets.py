"""Datasets as MLflow inputs: a sample of rows and the DVC md5, never the whole file."""

from __future__ import annotations

import json
from pathlib import Path

from components.config import load_config
from components.tracking import dvc_md5, stage_run

ROOT = Path(__file__).resolve().parents[2]


def test_log_dataset_keeps_a_sample_the_dvc_digest_and_its_context(tmp_path: Path):
    import mlflow

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    tasks = tmp_path / "data" / "tasks.jsonl"
    tasks.parent.mkdir()
    rows = [{"task_id": f"t{i}", "split": "train", "walkthrough": ["a", "b"]} for i in range(5)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = tmp_path / "data" / "buffer"
    folder.mkdir()
    (folder / "x.lance").write_bytes(b"0123")
    with stage_run("train", "agent", cfg, (), tmp_path) as run:
        run.log_dataset(tasks, "tasks", "training", rows=3)
        run.log_dataset(folder, "buffer", "training", sample=tasks)
        run_id = run.run_id
    inputs = {i.dataset.name: i for i in mlflow.get_run(run_id).inputs.dataset_inputs}
    logged = inputs["tasks"]
    assert logged.dataset.digest == dvc_md5(tasks)  # the md5 dvc.lock has for it
    assert json.loads(logged.dataset.source) == {"uri": "data/tasks.jsonl"}
    assert json.loads(logged.dataset.profile)["num_rows"] == 3  # a sample, not the file
    schema = json.dumps(json.loads(logged.dataset.schema))
    assert "walkthrough" in schema  # a list column is kept as its length
    tags = {t.key: t.value for t in logged.tags}
    assert tags["mlflow.data.context"] == "training" and tags["sample_rows"] == "3"
    assert inputs["buffer"].dataset.digest == dvc_md5(folder)
    assert {t.key: t.value for t in inputs["buffer"].tags}["bytes"] == "4"


def test_stage_run_logs_its_data_inputs_as_datasets_but_not_models(tmp_path: Path):
    import mlflow

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    tasks = tmp_path / "data" / "tasks" / "tasks.jsonl"
    tasks.parent.mkdir(parents=True)
    tasks.write_text(json.dumps({"task_id": "t0", "split": "test"}) + "\n")
    policy = tmp_path / "models" / "policy" / "sft"
    policy.mkdir(parents=True)
    (policy / "weights.pt").write_bytes(b"w")
    data = {"tasks": tasks, "policy": policy}
    with stage_run("evaluate_policy@sft", "agent", cfg, (), tmp_path, data) as run:
        run_id = run.run_id
    inputs = mlflow.get_run(run_id).inputs.dataset_inputs
    assert [i.dataset.name for i in inputs] == ["tasks"]
    assert {t.key: t.value for t in inputs[0].tags}["mlflow.data.context"] == "evaluation"
    assert inputs[0].dataset.digest == dvc_md5(tasks)
