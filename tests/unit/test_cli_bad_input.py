"""Simple bad input to a command ends it with one ``error:`` line, never a traceback, and
before anything is written: an --out that is a file, an unknown --reward."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli import app
from components.io import InputError

ROOT = Path(__file__).resolve().parents[2]
COMMON = ("--params", str(ROOT / "params.yaml"), "--profile", "ci")


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, *COMMON], catch_exceptions=False)


def test_claim_refuses_a_file_where_its_folder_should_be(tmp_path: Path):
    from components import manifest

    out = tmp_path / "results"
    out.write_text("the user's file\n")
    with pytest.raises(InputError, match="is a file, not a folder"):
        manifest.claim(out, ["success.json"], force=True, what="evaluate-external")
    assert out.read_text() == "the user's file\n"


def test_evaluate_external_out_is_a_file_is_a_one_line_error(tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("{}\n")  # quarantined: the --out check comes first anyway
    out = tmp_path / "results.txt"
    out.write_text("the user's file\n")
    r = _cli(
        "evaluate-external",
        *("--tasks", str(tasks), "--policy", "sft", "--out", str(out), "--root", str(tmp_path)),
    )
    assert r.exit_code == 1
    assert r.output.splitlines() == [
        f"error: {out} is a file, not a folder: name a folder for the outputs"
    ]
    assert out.read_text() == "the user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.txt", "tasks.jsonl"]


def test_an_unknown_transfer_reward_is_a_usage_error_naming_the_valid_ones(tmp_path: Path):
    from components.stages.transfer import REWARDS

    assert set(REWARDS) == {"won", "score"}
    r = _cli(
        "transfer",
        *("--source", str(tmp_path / "src"), "--reward", "points", "--root", str(tmp_path)),
    )
    assert r.exit_code == 2  # refused before the source is even looked at
    assert "Invalid value for --reward: 'points' is not one of won, score" in r.output
    assert "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []
