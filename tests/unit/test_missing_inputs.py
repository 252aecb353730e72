"""A stage whose input is missing refuses with one line naming the stage to run first
(``error: <path> missing: run `dreamgym <stage>```, exit 1), not a raw errno or a
traceback, and before it starts an MLflow run or writes anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli import EXIT_ERROR, app

ROOT = Path(__file__).resolve().parents[2]
COMMON = ("--params", str(ROOT / "params.yaml"), "--profile", "ci")
TRAJECTORIES = "data/ingested/trajectories.jsonl"
TASKS = "data/tasks/tasks.jsonl"


@pytest.mark.parametrize(
    ("command", "present", "missing", "hint"),
    [
        ("annotate", (), TRAJECTORIES, "dreamgym ingest"),
        ("judge", (), TRAJECTORIES, "dreamgym ingest"),
        ("judge", (TRAJECTORIES,), TASKS, "dreamgym generate-tasks"),
        (
            "judge",
            (TRAJECTORIES, TASKS),
            "models/experience/full",
            "dreamgym train-experience-model",
        ),
        ("drift", (), TRAJECTORIES, "dreamgym ingest"),
    ],
)
def test_a_missing_input_names_the_stage_to_run(
    tmp_path: Path, command: str, present: tuple[str, ...], missing: str, hint: str
):
    for name in present:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    before = sorted(tmp_path.rglob("*"))
    r = CliRunner().invoke(app, [command, *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.output.splitlines() == [f"error: {tmp_path / missing} missing: run `{hint}`"]
    assert sorted(tmp_path.rglob("*")) == before  # no lock, no mlflow.db, no output folder


def test_drift_without_synthetic_trajectories_names_train_dreamgym(tmp_path: Path):
    (tmp_path / TRAJECTORIES).parent.mkdir(parents=True)
    (tmp_path / TRAJECTORIES).write_text("")
    r = CliRunner().invoke(app, ["drift", *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.output.splitlines() == [
        f"error: no synthetic trajectories in {tmp_path / 'data' / 'synthetic'}: "
        "run `dreamgym train-dreamgym`"
    ]
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("command", [["evaluate-random"], ["evaluate-policy", "random"]])
def test_evaluating_a_suite_without_a_test_split_is_one_line(tmp_path: Path, command):
    # a ValueError once: a traceback for a suite generated with no test games
    from components.schema import write_jsonl
    from tests.factories import make_task

    write_jsonl(tmp_path / TASKS, [make_task("tw-quest-0"), make_task("tw-quest-1")])
    before = sorted(tmp_path.rglob("*"))
    r = CliRunner().invoke(app, [*command, *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.output.splitlines() == [
        f"error: {tmp_path / TASKS} has no test split to evaluate on: regenerate the suite "
        "(`dreamgym generate-tasks --force`) with test games"
    ]
    assert sorted(tmp_path.rglob("*")) == before
