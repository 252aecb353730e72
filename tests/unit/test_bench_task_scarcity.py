"""The task-scarcity bench: its arms' overrides, its JSON from existing results, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.selection import overridden
from bench.task_scarcity import ARMS, main

ROOT = Path(__file__).resolve().parents[2]


def test_every_arm_is_a_valid_override(tmp_path: Path) -> None:
    from components.config import load_config

    cfg = load_config(ROOT / "params.yaml")
    frontier = overridden(cfg, [*ARMS["frontier"], "curriculum.max_real_tasks=16"])
    assert frontier.curriculum.generated_order == "frontier"
    assert frontier.curriculum.max_real_tasks == 16
    assert overridden(cfg, ARMS["no_generation"]).ablation.no_task_generation


def _results(path: Path, wins: dict[str, int]) -> None:
    rows = [
        {"seed": s, "task_id": g, "success": int(s < k)} for g, k in wins.items() for s in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_existing_results_are_reused_and_paired(tmp_path: Path, monkeypatch, capsys) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    suite = tmp_path / "suite"
    (suite / "data" / "tasks").mkdir(parents=True)
    (suite / "data" / "tasks" / "tasks.jsonl").write_text("")
    (suite / "results").mkdir()
    _results(suite / "results" / "scarce16_no_generation.jsonl", {"a": 1, "b": 0})
    _results(suite / "results" / "scarce16_newest.jsonl", {"a": 3, "b": 1})
    _results(suite / "results" / "scarce16_frontier.jsonl", {"a": 3, "b": 3})
    monkeypatch.chdir(tmp_path)
    main(["--budgets", "16", "--suite", str(suite), "--out", "out.json"])
    row = json.loads((tmp_path / "out.json").read_text())["budgets"]["16"]
    assert row["no_generation"]["success"] == pytest.approx(1 / 6)
    assert row["frontier"]["episodes"] == 6 and row["frontier"]["games"] == 2
    assert row["newest_vs_no_generation"]["diff"] == pytest.approx(0.5)
    assert row["frontier_vs_newest"]["diff"] == pytest.approx(1 / 3, abs=1e-4)
    assert (
        "16 real tasks: no_generation 16.7, newest 66.7, frontier 100.0" in capsys.readouterr().out
    )
    # kept results of another code, paired with the arm of the same name
    _results(suite / "results" / "scarce16_frontier_before.jsonl", {"a": 3, "b": 0})
    main(["--budgets", "16", "--suite", str(suite), "--out", "out.json", "--compare-to", "before"])
    row = json.loads((tmp_path / "out.json").read_text())["budgets"]["16"]
    assert row["frontier_before"]["success"] == pytest.approx(0.5)
    assert row["frontier_vs_frontier_before"]["diff"] == pytest.approx(0.5)
    assert "newest_before" not in row  # no kept results: nothing to pair


def test_a_missing_suite_is_a_one_line_error(tmp_path: Path, monkeypatch) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["--suite", "nowhere"])
    assert "bench.selection generate" in str(err.value) and "\n" not in str(err.value)
