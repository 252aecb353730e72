"""The CLI starts fast: no torch, trainers or other heavy libraries at import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "trl", "mlflow", "great_expectations", "lancedb", "textworld")


def test_help_imports_nothing_heavy():
    code = (
        "import sys, json\n"
        "from typer.testing import CliRunner\n"
        "from components.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_dvc_stage_has_a_cli_command():
    import yaml
    from typer.testing import CliRunner

    from components.cli import app

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    help_text = CliRunner().invoke(app, ["--help"]).output
    for name, stage in stages.items():
        stage = stage.get("do", stage)  # foreach stages keep their command under `do`
        command = stage["cmd"].split()[1]
        assert command == name.replace("_", "-")
        assert command in help_text


def test_every_dvc_stage_depends_on_the_module_that_runs_it():
    """A stage's own code is a dep: a change to it makes the stage stale (stages/data.py,
    the four data stages' functions, was in no stage's deps)."""
    import yaml

    from components.cli import STAGES

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    modules = {s.name: f"components/stages/{s.run.split(':')[0]}.py" for s in STAGES}
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        deps = [str(d).split()[0] for d in stage.get("deps", [])]
        module = modules[stage["cmd"].split()[1]]
        covered = any(module == d or module.startswith(d.rstrip("/") + "/") for d in deps)
        assert covered, f"{name}: {module} is not among its deps"


def test_each_command_summary_in_help_is_its_first_paragraph_on_one_line():
    # typer's rich help kept the docstring's line breaks: summaries broke mid-sentence
    import inspect

    import typer

    from components.cli import app

    for name, command in typer.main.get_command(app).commands.items():
        first = inspect.cleandoc(command.callback.__doc__ or "").split("\n\n")[0]
        assert command.short_help == " ".join(first.split()), name
        assert "\n" not in command.short_help, name


def test_help_shows_no_value_type_after_a_flag():
    # typer 0.29 wrote `--fresh <bool>`: users then typed `--fresh true` and got an error
    import typer
    from typer.testing import CliRunner

    from components.cli import app

    runner = CliRunner()
    assert "<bool>" not in runner.invoke(app, ["--help"]).output
    for name in typer.main.get_command(app).commands:
        out = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).output
        assert "--help" in out and "<bool>" not in out, name
    assert "<path>" in runner.invoke(app, ["annotate", "--help"]).output  # values keep theirs


def test_every_command_and_option_the_docs_name_exists():
    # a newcomer follows the README literally: a renamed command or flag must fail here
    import re

    import typer

    from components.cli import app

    commands = typer.main.get_command(app).commands
    docs = [ROOT / "README.md", ROOT / "Makefile", ROOT / "dvc.yaml", *(ROOT / "docs").glob("*.md")]
    named = re.compile(
        r"dreamgym ([a-z][a-z0-9-]+)((?: +(?:--?[a-z][a-z0-9-]*|[\w./=<>{}:,@-]+))*)"
    )
    wrong, seen = [], 0
    for doc in docs:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for found in named.finditer(line):
                seen += 1
                command, rest = commands.get(found.group(1)), found.group(2)
                if command is None:
                    wrong.append(f"{doc.name}:{n}: no command {found.group(1)}")
                    continue
                opts = {"--help"}.union(*(p.opts + p.secondary_opts for p in command.params))
                for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    if opt not in opts:
                        wrong.append(f"{doc.name}:{n}: {found.group(1)} has no {opt}")
    assert seen > 50 and not wrong, wrong


def test_bad_params_exit_with_a_clear_message(tmp_path: Path):
    bad = tmp_path / "params.yaml"
    bad.write_text("profile: cpu\ncollect: {foo: 1}\n")
    out = subprocess.run(
        [sys.executable, "-m", "components.cli", "config", "--params", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "collect.foo: unknown key" in out.stderr


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    from typer.testing import CliRunner

    from components.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"dreamgym {version('dreamgym')}"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "components.cli", *args, "--params", str(ROOT / "params.yaml")],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def test_collect_with_no_task_keeps_what_was_collected(tmp_path: Path):
    # resuming prunes episodes the plan lacks: an empty task list once deleted them all
    (tmp_path / "data" / "tasks").mkdir(parents=True)
    (tmp_path / "data" / "tasks" / "tasks.jsonl").write_text("")
    kept = tmp_path / "data" / "raw" / "tw-quest-000.jsonl"
    kept.parent.mkdir(parents=True)
    kept.write_text('{"episode_id": "e"}\n')
    out = _cli("collect", "--root", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error:") and "holds no task" in out.stderr
    assert kept.read_text() == '{"episode_id": "e"}\n'


def test_a_damaged_intermediate_file_is_one_line_naming_its_line(tmp_path: Path):
    (tmp_path / "data" / "tasks").mkdir(parents=True)
    (tmp_path / "data" / "tasks" / "tasks.jsonl").write_text('{"task_id": "x"}\n')
    out = _cli("collect", "--root", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "tasks.jsonl:1: not a valid Task record" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("command", "damaged_file", "content"),
    [
        ("promote", "metrics/table1.json", '{"textworld": {bad'),
        ("build-buffer", "data/ingested/transitions.parquet", "PAR1 not parquet"),
    ],
)
def test_a_damaged_json_or_parquet_output_is_one_line(tmp_path, command, damaged_file, content):
    from tests.factories import make_task

    tasks = tmp_path / "data" / "tasks" / "tasks.jsonl"
    tasks.parent.mkdir(parents=True)
    tasks.write_text(make_task("t1", "do x", 1).model_dump_json() + "\n")
    path = tmp_path / damaged_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    out = _cli(command, "--root", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and out.stderr.strip().splitlines()[-1] == errors[0]
    assert f"{damaged_file}: not " in errors[0] and "the file is damaged" in errors[0]
    assert path.read_text() == content  # nothing overwritten


def test_a_root_that_does_not_exist_is_refused_before_anything_is_made(tmp_path):
    typo = tmp_path / "typo"
    out = _cli("report", "--root", str(typo), cwd=tmp_path)
    assert (
        out.returncode == 2
        and out.stderr.strip() == f"error: --root {typo}: no such folder (the project root)"
    )
    assert not typo.exists()


def test_root_alone_reads_that_projects_params(tmp_path: Path):
    # --params defaulted to ./params.yaml: another project's run took this folder's params
    from typer.testing import CliRunner

    from components.cli import app

    params = yaml_params(profile="ci")
    (tmp_path / "params.yaml").write_text(params)
    r = CliRunner().invoke(app, ["config", "--root", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["profile"] == "ci"  # this checkout's params.yaml says cpu
    r = CliRunner().invoke(app, ["config", "--root", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no such folder" in r.output
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app, ["config", "--root", str(tmp_path / "empty")])
    assert r.exit_code == 2
    assert f"{tmp_path / 'empty' / 'params.yaml'} not found" in r.output
    # --params still wins
    r = CliRunner().invoke(
        app, ["config", "--root", str(tmp_path), "--params", str(ROOT / "params.yaml")]
    )
    assert r.exit_code == 0 and json.loads(r.output)["profile"] == "cpu"


def yaml_params(**top: str) -> str:
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    return yaml.safe_dump({**raw, **top})
