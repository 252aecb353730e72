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


def test_seeds_an_arm_lacks_are_trained_and_added(tmp_path: Path, monkeypatch, capsys) -> None:
    """--seeds 0,1,2,3: only seed 3 is retrained and evaluated, its rows join the 3 kept;
    two scarce budgets also get one pooled verdict per pair."""
    import bench.task_scarcity as ts

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    suite = tmp_path / "suite"
    (suite / "data" / "tasks").mkdir(parents=True)
    (suite / "data" / "tasks" / "tasks.jsonl").write_text("")
    (suite / "results").mkdir()
    for budget in (8, 16):
        _results(suite / "results" / f"scarce{budget}_no_generation.jsonl", {"a": 1, "b": 0})
        _results(suite / "results" / f"scarce{budget}_newest.jsonl", {"a": 3, "b": 1})
        _results(suite / "results" / f"scarce{budget}_frontier.jsonl", {"a": 3, "b": 3})
    trained: list[tuple[str, list[int]]] = []

    def fake_retrain(cfg, root, name, kind, algo, seeds):
        trained.append((name, list(seeds)))

    def fake_evaluate(cfg, root, suite_, name, method, seeds, keep_other_seeds):
        assert keep_other_seeds and method == "selection_" + name
        out = suite_ / "results" / f"{name}.jsonl"
        new = [{"seed": s, "task_id": g, "success": 1} for g in ("a", "b") for s in seeds]
        out.write_text(out.read_text() + "".join(json.dumps(r) + "\n" for r in new))
        return {"success": 1.0, "episodes": len(new)}

    starts: list[list[int]] = []
    monkeypatch.setattr(ts, "sft_starts", lambda cfg, root, seeds: starts.append(list(seeds)))
    monkeypatch.setattr(ts, "retrain", fake_retrain)
    monkeypatch.setattr(ts, "evaluate", fake_evaluate)
    monkeypatch.chdir(tmp_path)
    main(["--budgets", "8,16", "--seeds", "0,1,2,3", "--suite", str(suite), "--out", "o.json"])
    assert sorted(trained) == sorted((f"scarce{b}_{a}", [3]) for b in (8, 16) for a in ARMS)
    assert starts == [[3]] * len(trained)  # each retrain first makes sure seed 3 has its SFT
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["seeds"] == [0, 1, 2, 3]
    row = out["budgets"]["16"]
    assert row["no_generation"]["episodes"] == 8 and row["no_generation"]["per_seed"]["3"] == 1.0
    assert row["no_generation"]["success"] == pytest.approx(3 / 8)
    pooled = out["pooled_over_scarce_budgets"]
    assert pooled["budgets"] == ["8", "16"]
    assert pooled["frontier_vs_no_generation"]["diff"] == pytest.approx(
        row["frontier_vs_no_generation"]["diff"], abs=1e-4
    )
    assert "over 2 scarce budgets" in capsys.readouterr().out
    # fewer seeds than the files hold: the others are left out of every figure
    trained.clear()
    main(["--budgets", "16", "--seeds", "0,1", "--suite", str(suite), "--out", "o.json"])
    out = json.loads((tmp_path / "o.json").read_text())
    assert not trained and out["budgets"]["16"]["frontier"]["episodes"] == 4
    assert out["pooled_over_scarce_budgets"] is None  # one budget: nothing to pool


def test_a_missing_suite_is_a_one_line_error(tmp_path: Path, monkeypatch) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["--suite", "nowhere"])
    assert "bench.selection generate" in str(err.value) and "\n" not in str(err.value)
