"""bench/stage_overhead.py counts a pipeline's stage runs and times DVC's lock rewrite."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.stage_overhead import lock_round_trip_seconds, stage_runs

ROOT = Path(__file__).resolve().parents[2]


def test_a_foreach_stage_counts_once_per_item(tmp_path: Path):
    dvc_yaml = tmp_path / "dvc.yaml"
    stages = {
        "a": {"cmd": "true"},
        "b": {"foreach": ["x", "y", "z"], "do": {"cmd": "echo ${item}"}},
        "c": {"foreach": {"p": 1, "q": 2}, "do": {"cmd": "echo ${key}"}},
    }
    dvc_yaml.write_text(yaml.safe_dump({"stages": stages}))
    assert stage_runs(dvc_yaml) == 1 + 3 + 2
    # the project's own pipeline: every stage once, evaluate_policy once per method
    project = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert stage_runs(ROOT / "dvc.yaml") > len(project)


def test_the_lock_round_trip_leaves_the_lock_it_was_given_alone(tmp_path: Path):
    lock = tmp_path / "dvc.lock"
    text = "schema: '2.0'\n# kept\nstages:\n  a:\n    cmd: true\n"
    lock.write_text(text)
    times = lock_round_trip_seconds(lock, repeats=2)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert lock.read_text() == text  # timed on a copy
