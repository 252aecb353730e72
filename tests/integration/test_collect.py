"""Real-data collection on real TextWorld games: records, policies, resume after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.config import Config
from components.data.collect import collect, plan_episodes
from components.schema import Trajectory, Transition, read_jsonl
from tests.factories import make_trajectory
from tests.integration.textworld_suite import Suite
from tests.procs import alive, children

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _read(out_dir: Path) -> list[Trajectory]:
    return [t for p in sorted(out_dir.glob("*.jsonl")) for t in read_jsonl(p, Trajectory)]


def _whole_lines(out_dir: Path) -> list[str]:
    """The whole lines of the files (what a resume keeps; a torn last line is not one)."""
    lines = []
    for p in sorted(out_dir.glob("*.jsonl")):
        data = p.read_text()
        lines += data[: data.rfind("\n") + 1].splitlines()
    return lines


def _lines(out_dir: Path) -> dict[str, set[str]]:
    return {p.name: set(p.read_text().splitlines()) for p in sorted(out_dir.glob("*.jsonl"))}


@pytest.fixture(scope="module")
def collected(tw_suite: Suite) -> tuple[Path, dict]:
    """One full collection in-process (the reference the other tests compare with)."""
    out = tw_suite.root / "raw_ref"
    inline = tw_suite.cfg.collect.model_copy(update={"workers": 1})
    cfg = tw_suite.cfg.model_copy(update={"collect": inline})
    return out, collect(cfg, tw_suite.tasks, out, tw_suite.root, progress=False)


def test_plan_never_includes_unlisted_splits(tw_suite: Suite):
    cfg = tw_suite.cfg
    test_ids = {t.task_id for t in tw_suite.tasks if t.split == "test"}
    assert test_ids
    plans = plan_episodes(cfg, tw_suite.tasks)
    assert plans and not {p.task_id for p in plans} & test_ids
    per_game = sum(cfg.collect.episodes.values())
    assert len(plans) == per_game * sum(t.split != "test" for t in tw_suite.tasks)
    assert len({p.episode_id for p in plans}) == len(plans)
    assert plans == plan_episodes(cfg, list(reversed(tw_suite.tasks)))  # deterministic
    with_test = cfg.collect.model_copy(update={"splits": ("train", "validation", "test")})
    plans_all = plan_episodes(cfg.model_copy(update={"collect": with_test}), tw_suite.tasks)
    assert test_ids <= {p.task_id for p in plans_all}


def test_a_new_collection_round_plans_new_episodes_on_the_same_tasks(tw_suite: Suite):
    cfg = tw_suite.cfg
    round0 = plan_episodes(cfg, tw_suite.tasks)
    next_round = cfg.model_copy(update={"collect": cfg.collect.model_copy(update={"round": 1})})
    round1 = plan_episodes(next_round, tw_suite.tasks)
    assert [(p.task_id, p.policy, p.index) for p in round0] == [
        (p.task_id, p.policy, p.index) for p in round1
    ]
    assert not {p.episode_id for p in round0} & {p.episode_id for p in round1}
    assert len({p.seed for p in round1} - {p.seed for p in round0}) == len(round1)


def test_collect_writes_valid_trajectories_with_successes_and_failures(
    tw_suite: Suite, collected: tuple[Path, dict]
):
    out, summary = collected
    trajs = _read(out)
    n_games = sum(t.split != "test" for t in tw_suite.tasks)
    assert summary["n_trajectories"] == len(trajs) == 5 * n_games
    assert summary["n_transitions"] == sum(t.n_steps for t in trajs)
    assert summary["n_games"] == {"train": 3, "validation": 1, "test": 1}
    assert summary["steps_per_s"] > 0 and summary["n_new_trajectories"] == len(trajs)
    assert {t.split for t in trajs} <= {"train", "validation"}  # never the test split
    assert summary["policies"]["expert"] == {"n": n_games, "success_rate": 1.0}
    assert any(t.success for t in trajs) and any(not t.success for t in trajs)
    assert any(t.truncated for t in trajs)
    steps = [s for t in trajs for s in t.steps]
    assert any(not s.valid_action for s in steps) and any(s.valid_action for s in steps)
    for t in trajs:
        assert t.source == "real" and t.initial_state == t.steps[0].state
        for i, s in enumerate(t.steps):
            assert s.id == Transition.make_id(t.episode_id, i)
            assert s.provenance.policy == t.policy and s.provenance.seed is not None
            assert s.admissible_actions and s.done == (i == t.n_steps - 1)
            assert s.reward == int(t.success and s.done)
            if i:
                assert s.state == t.steps[i - 1].next_state
    # a rerun has nothing left to do
    again = collect(tw_suite.cfg, tw_suite.tasks, out, tw_suite.root, progress=False)
    assert again["n_new_trajectories"] == 0 and again["n_resumed_trajectories"] == len(trajs)
    assert again["policies"] == summary["policies"]


_CHILD = """
import sys
from pathlib import Path
from components.config import Config
from components.data.collect import collect
from components.envs.textworld_tasks import load_task_suite
cfg = Config.model_validate_json(Path(sys.argv[1]).read_text())
root = Path(sys.argv[2])
collect(cfg, load_task_suite(root / "data" / "tasks"), Path(sys.argv[3]), root, progress=False)
"""


def _kill_after_first_episode(cfg: Config, root: Path, out: Path) -> None:
    cfg_file = root / "cfg_kill.json"
    cfg_file.write_text(cfg.model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(cfg_file), str(root), str(out)], cwd=ROOT
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(p.read_bytes().count(b"\n") for p in out.glob("*.jsonl")) >= 1:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "collection finished before it could be interrupted"
    workers = children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # orphaned pool workers notice and exit instead of writing on behind a resumed run
    # (their watcher polls every 0.2 s; a starved worker on a loaded host takes longer)
    deadline = time.monotonic() + 60
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(w) for w in workers)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_resume_after_kill_loses_and_duplicates_nothing(
    tw_suite: Suite, collected: tuple[Path, dict]
):
    ref_out, ref_summary = collected
    out = tw_suite.root / "raw_killed"
    cfg = tw_suite.cfg  # 2 worker processes
    assert cfg.collect.workers == 2
    _kill_after_first_episode(cfg, tw_suite.root, out)
    # the kill itself may have torn the line a worker was writing (the last of its file)
    torn_by_kill = {p for p in out.glob("*.jsonl") if p.read_bytes()[-1:] not in (b"", b"\n")}
    partial = _whole_lines(out)
    assert 1 <= len(partial) < ref_summary["n_trajectories"]
    # also a torn line and a record that is not in the plan
    first = sorted(out.glob("*.jsonl"))[0]
    foreign = make_trajectory(task_id=first.stem, policy="noisy", idx=99)
    with first.open("a") as f:
        if first in torn_by_kill:
            f.write("\n")  # ends the kill's torn line: now a whole, invalid one
        f.write(foreign.model_dump_json() + "\n")
        f.write('{"episode_id": "torn')
    summary = collect(cfg, tw_suite.tasks, out, tw_suite.root, progress=False)
    assert summary["n_torn_lines"] == 1 + len(torn_by_kill - {first})
    assert summary["n_dropped_records"] == 1 + (first in torn_by_kill)
    assert summary["n_resumed_trajectories"] == len(partial)
    assert summary["n_trajectories"] == ref_summary["n_trajectories"]
    trajs = _read(out)
    assert len({t.episode_id for t in trajs}) == len(trajs) == ref_summary["n_trajectories"]
    # same episodes, same content as the uninterrupted in-process run (deterministic)
    assert _lines(out) == _lines(ref_out)


def test_records_of_a_changed_plan_are_dropped(tw_suite: Suite, tmp_path: Path):
    # collect one game, then shrink the plan: records no longer planned are removed
    out = tmp_path / "raw"
    task = tw_suite.task("treasure")
    small = tw_suite.cfg.collect.model_copy(
        update={"episodes": {"expert": 1, "random": 2}, "workers": 1}
    )
    cfg = tw_suite.cfg.model_copy(update={"collect": small})
    first = collect(cfg, [task], out, tw_suite.root, progress=False)
    assert first["n_trajectories"] == 3
    fewer = small.model_copy(update={"episodes": {"expert": 1, "random": 1}})
    second = collect(cfg.model_copy(update={"collect": fewer}), [task], out, tw_suite.root, False)
    assert second["n_dropped_records"] == 1 and second["n_trajectories"] == 2
    assert second["n_new_trajectories"] == 0
    rows = [json.loads(line) for line in (out / f"{task.task_id}.jsonl").read_text().splitlines()]
    assert sorted(r["policy"] for r in rows) == ["expert", "random"]
