"""``python -m flows.<module>``: every entry point parses its arguments before doing any work.

Each runs in an empty folder with a Prefect API that cannot be reached: a module that
ignored its arguments and started its flow would fail there (or run a pipeline), not
print its usage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = sorted(
    f"flows.{path.stem}"
    for path in (ROOT / "flows").glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(cwd.parent / "prefect-home"))
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # discard port: no flow run can start
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_entry_points_are_found():
    assert {"flows.envs", "flows.pipeline"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_prints_the_usage_and_does_nothing_and_unknown_arguments_fail(
    module: str, tmp_path: Path
):
    work = tmp_path / "work"
    work.mkdir()
    shown = _run(module, "--help", cwd=work)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: python -m {module}")
    assert "--root" in shown.stdout
    wrong = _run(module, "--no-such-option", cwd=work)
    assert wrong.returncode == 2
    assert "unrecognized arguments: --no-such-option" in wrong.stderr
    assert list(work.iterdir()) == []  # nothing written: no mlflow.db, no .dvc, no workspace


def test_pipeline_refuses_an_unknown_stage_or_a_missing_dvc_yaml_in_one_line(
    tmp_path: Path, capsys
):
    from flows.pipeline import main

    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {tmp_path / 'dvc.yaml'} not found (run from the project root or pass --root)"
    ]
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path), "--stage", "report", "--stage", "nope"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown stages ['nope']; dvc.yaml has")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.yaml"]


def test_pipeline_refuses_a_bad_params_yaml_before_any_prefect_or_mlflow_run(
    tmp_path: Path, capsys
):
    # it started a Prefect server and an MLflow run, then failed in the first stage
    from flows.pipeline import main

    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(
        (ROOT / "params.yaml").read_text(encoding="utf-8").replace("seed: 0", "seed: -1", 1)
    )
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path)])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid configuration (")
    assert "seed: Input should be greater than or equal to 0" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.yaml", "params.yaml"]


def test_envs_set_with_a_bad_yaml_value_is_a_usage_error(tmp_path: Path, capsys):
    from flows.envs import main

    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path), "--env", "textworld", "--set", "agent.seeds=[0,1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--set 'agent.seeds=[0,1': not a YAML value" in err
    assert list(tmp_path.iterdir()) == []
