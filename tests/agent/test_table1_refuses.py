"""``dreamgym table1`` with nothing of its env evaluated refuses ("run evaluate-... first")
and writes nothing: a table of "not evaluated" rows would replace the committed results.
One evaluated method is enough to build it, and the other envs' rows stay."""

from __future__ import annotations

import errno
import json
from pathlib import Path

from typer.testing import CliRunner

from components.cli import app
from tests.factories import run_provenance, table1_row

ROOT = Path(__file__).resolve().parents[2]
COMMON = ("--params", str(ROOT / "params.yaml"), "--profile", "ci")
OTHER_ENV = {
    "_provenance": run_provenance("scienceworld", "old"),
    "scienceworld": {"sft": table1_row(0.3)},
}


def _project(root: Path) -> dict[Path, bytes]:
    """A project with committed Table-1 outputs and no evaluation episodes; its files."""
    metrics = root / "metrics"
    (metrics / "headline").mkdir(parents=True)
    (metrics / "table1.json").write_text(json.dumps(OTHER_ENV))
    (metrics / "table1.md").write_text("the committed table\n")
    (metrics / "headline" / "table1.json").write_text('{"committed": true}\n')
    (metrics / "eval").mkdir()  # summaries alone are not the episodes Table 1 is built from
    (metrics / "eval" / "sft.json").write_text('{"env": "textworld", "method": "sft"}\n')
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_table1_with_nothing_evaluated_refuses_and_writes_nothing(tmp_path: Path):
    before = _project(tmp_path)
    (tmp_path / "data" / "eval").mkdir(parents=True)
    (tmp_path / "data" / "eval" / "sft.jsonl").write_text("")  # an empty file: no episode
    r = CliRunner().invoke(app, ["table1", *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == 1
    assert r.output.splitlines() == [
        f"error: no textworld evaluation episodes under {tmp_path / 'data' / 'eval'}: run "
        "`dreamgym evaluate-random` and `dreamgym evaluate-policy METHOD` first"
    ]
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == {**before, tmp_path / "data" / "eval" / "sft.jsonl": b""}  # no mlflow.db


def test_one_evaluated_method_builds_table1_and_keeps_the_other_envs(tmp_path: Path):
    _project(tmp_path)
    rows = [
        {"method": "random", "mode": "sampled", "seed": s, "pass": 0, "task_id": t, "success": w}
        for s in (0, 1)
        for t, w in (("g0", 1), ("g1", 0))
    ]
    (tmp_path / "data" / "eval").mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "data" / "eval" / "random.jsonl").write_text(text)
    r = CliRunner().invoke(app, ["table1", *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == 0, r.output
    table = json.loads((tmp_path / "metrics" / "table1.json").read_text())
    assert table["textworld"]["random"]["success"] == 0.5
    assert table["textworld"]["sft"] is None  # not evaluated: never filled in
    assert table["scienceworld"] == OTHER_ENV["scienceworld"]
    assert table["_provenance_by_env"]["scienceworld"] == OTHER_ENV["_provenance"]
    assert "### scienceworld" in (tmp_path / "metrics" / "table1.md").read_text()


def test_table1_replaces_its_three_files_together_or_none(tmp_path: Path, monkeypatch):
    before = _project(tmp_path)
    (tmp_path / "data" / "eval").mkdir(parents=True)
    row = {"method": "random", "mode": "sampled", "seed": 0, "pass": 0, "task_id": "g0"}
    (tmp_path / "data" / "eval" / "random.jsonl").write_text(json.dumps({**row, "success": 1}))
    write_text = Path.write_text

    def disk_full_on_the_markdown(self: Path, *args, **kwargs):
        if "table1.md" in self.name:  # the file or its temporary
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_full_on_the_markdown)
    r = CliRunner().invoke(app, ["table1", *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == 1 and "No space left on device" in r.output
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == {
        **before,
        tmp_path / "data" / "eval" / "random.jsonl": after[
            tmp_path / "data" / "eval" / "random.jsonl"
        ],
    }  # the JSON files, written before the markdown, are the committed ones still


def test_a_damaged_episode_line_is_one_error_naming_it_and_writes_nothing(tmp_path: Path):
    before = _project(tmp_path)
    (tmp_path / "data" / "eval").mkdir(parents=True)
    good = json.dumps(
        {"method": "random", "mode": "sampled", "seed": 0, "pass": 0, "task_id": "g0", "success": 1}
    )
    episodes = tmp_path / "data" / "eval" / "random.jsonl"
    episodes.write_text(f"{good}\n\n" + '{"method": "random", "succ\n')  # cut off mid-write
    r = CliRunner().invoke(app, ["table1", *COMMON, "--root", str(tmp_path)])
    assert r.exit_code == 1
    [line] = r.output.splitlines()
    assert line.startswith(f"error: {episodes}:3: not a JSON line (Unterminated string")
    assert line.endswith(
        "the file is damaged; rerun the stage that writes it "
        "(`dvc repro --force <stage>`) or restore it"
    )
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != episodes}
    assert after == before  # Table 1 and its headline untouched, no mlflow.db
