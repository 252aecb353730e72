"""Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during a process
pool: the parent stops the workers at once, keeps what is written, prints one line and
exits with code 130; nothing hangs, no worker survives, a rerun resumes and completes.

The child is a script file: spawned pool workers import it too, so the slow fake env it
installs is the one they play (real collection code, no game engine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import alive, children
from tests.reliability.project import ROOT, child_env

pytestmark = pytest.mark.timeout(240)

STEP_S = 0.25  # each step of the fake env: a game of 3 episodes x 3 steps takes ~2 s

_CHILD = '''
import signal
import sys
import time
from pathlib import Path

# started as a shell starts a command: SIGINT handled and not blocked, whatever state the
# test runner's thread was in (a blocked mask and an ignored SIGINT both survive exec:
# the child then never saw the test's Ctrl-C, finished and exited 0)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)

import components.envs as envs
from components.envs.base import ADMISSIBLE, VALID, WON

STEP_S = float(sys.argv[3])


class SlowEnv:
    """Three steps to a win, each taking STEP_S."""

    def __init__(self):
        self.t = 0

    def _info(self, won=False):
        return {ADMISSIBLE: ["go east", "look"], VALID: True, WON: won}

    def reset(self, task, seed=None):
        self.t = 0
        return "a room", self._info()

    def step(self, action):
        time.sleep(STEP_S)
        self.t += 1
        won = self.t >= 3
        return f"room {self.t}", float(won), won, False, self._info(won)

    def expert_action(self):
        return "go east"

    def close(self):
        pass


envs.ENV_FACTORIES["textworld"] = lambda cfg, root, expert, shared: SlowEnv()


def slow_job(flag_dir, i):
    Path(flag_dir, f"started-{i}").touch()
    try:
        time.sleep(120)
    finally:  # what an env's close does (a browser, a JVM): it must run when stopped,
        time.sleep(0.2 + 0.8 * i)  # even when a sibling exits meanwhile (the pool's SIGTERM)
        Path(flag_dir, f"cleaned-{i}").touch()
    return i


if __name__ == "__main__":
    from components.config import load_config
    from tests.factories import make_task

    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "parallel":
        from components.stages.parallel import run_jobs

        print(run_jobs(slow_job, [(str(out), i) for i in range(4)], 2))
    else:
        cfg = load_config(Path("params.yaml"), "ci")
        c = cfg.collect.model_copy(
            update={"workers": 2, "splits": ("validation",), "episodes": {"expert": 3}}
        )
        cfg = cfg.model_copy(update={"collect": c})
        tasks = [make_task(f"tw-quest-{i}", split="validation", seed=i) for i in range(6)]
        from components.data.collect import collect

        summary = collect(cfg, tasks, out, Path("."), progress=False)
        print("SUMMARY " + __import__("json").dumps(summary))
'''


def _start(script: Path, mode: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        # its own session: the SIGINT below reaches it and its workers, as Ctrl-C would
        return subprocess.Popen(
            [sys.executable, str(script), mode, str(out), str(STEP_S)],
            cwd=ROOT,
            env=child_env(),
            stdout=f,
            stderr=f,
            start_new_session=True,
        )


def _wait_for(predicate, proc: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, f"the child exited ({proc.returncode}) before {what}"
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _interrupt(proc: subprocess.Popen[bytes]) -> tuple[float, list[int]]:
    """Ctrl-C the child's process group; (seconds until it exited, its workers)."""
    workers = children(proc.pid, pool_workers_only=True)
    os.killpg(proc.pid, signal.SIGINT)  # the group of the child we started, nothing else
    start = time.monotonic()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("the interrupted process hung (killed after 60 s)") from None
    waited = time.monotonic() - start
    deadline = time.monotonic() + 60  # a starved worker on a loaded host notices late
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if alive(w)], "a pool worker outlived the interrupt"
    return waited, workers


def _lines(out: Path) -> list[str]:
    return [line for p in sorted(out.glob("*.jsonl")) for line in p.read_text().splitlines()]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "interrupt_child.py"
    path.write_text(_CHILD)
    return path


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_ctrl_c_during_collect_exits_130_keeps_episodes_and_a_rerun_resumes(
    script: Path, tmp_path: Path
):
    out, log = tmp_path / "raw", tmp_path / "collect.log"
    proc = _start(script, "collect", out, log)
    # interrupt once an episode is on disk and games are still running and waiting
    _wait_for(lambda: len(_lines(out)) >= 1 if out.is_dir() else False, proc, "an episode")
    waited, workers = _interrupt(proc)
    text = log.read_text()
    assert proc.returncode == 130, text
    assert waited < 60, f"took {waited:.1f}s to exit"
    assert workers, "no pool worker was running"
    assert "Traceback" not in text and "env error" not in text, text
    said = [line for line in text.splitlines() if line.startswith("interrupted:")]
    kept = _lines(out)
    assert said == [f"interrupted: {len(kept)} of 18 episodes done; rerun to resume"], text
    assert 1 <= len(kept) < 18
    # what is kept resumes: the rerun plays only the rest, and every episode is there once
    log2 = tmp_path / "rerun.log"
    rerun = _start(script, "collect", out, log2)
    assert rerun.wait(timeout=120) == 0, log2.read_text()
    summary = json.loads(log2.read_text().split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["n_trajectories"] == 18 and summary["n_resumed_trajectories"] >= len(kept)
    ids = [json.loads(line)["episode_id"] for line in _lines(out)]
    assert len(ids) == len(set(ids)) == 18


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_ctrl_c_while_the_collect_workers_start_up_is_clean(script: Path, tmp_path: Path):
    # the workers are still importing (the window where they used to die with a traceback,
    # or survive with a half-imported module): they ignore SIGINT from their first moment
    out, log = tmp_path / "raw", tmp_path / "collect.log"
    proc = _start(script, "collect", out, log)
    workers = lambda: children(proc.pid, pool_workers_only=True)  # noqa: E731
    _wait_for(lambda: len(workers()) >= 2, proc, "the pool workers to spawn")
    waited, _ = _interrupt(proc)
    text = log.read_text()
    assert proc.returncode == 130, text
    assert waited < 60, f"took {waited:.1f}s to exit"
    assert "Traceback" not in text, text
    assert [line for line in text.splitlines() if line.startswith("interrupted:")], text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_ctrl_c_during_parallel_stage_jobs_exits_130_without_waiting(script: Path, tmp_path: Path):
    flags, log = tmp_path / "flags", tmp_path / "parallel.log"
    flags.mkdir()
    proc = _start(script, "parallel", flags, log)
    # both workers are inside a 120 s job, two more jobs wait: nothing of it is waited for
    started = lambda: [p for p in flags.iterdir() if p.name.startswith("started")]  # noqa: E731
    _wait_for(lambda: len(started()) >= 2, proc, "two jobs to start")
    waited, workers = _interrupt(proc)
    text = log.read_text()
    assert proc.returncode == 130, text
    assert waited < 60, f"took {waited:.1f}s to exit"
    assert len(workers) >= 2 and "Traceback" not in text, text
    said = [line for line in text.splitlines() if line.startswith("interrupted:")]
    assert said == ["interrupted: 0 of 4 jobs finished"], text
    # the jobs not started never ran; the two stopped ones ran their cleanup
    assert sorted(p.name for p in flags.iterdir()) == [
        "cleaned-0",
        "cleaned-1",
        "started-0",
        "started-1",
    ]


def test_ctrl_c_outside_a_pool_says_so_in_one_line(capsys):
    # typer turns it into a silent exit 130: the user could not tell it from a crash
    from components.cli_process import DreamgymTyper
    from components.pool import interrupted

    app = DreamgymTyper()

    @app.command()
    def stage(pool: bool = False) -> None:
        if pool:  # a pool's interrupt prints its own line: never a second one
            raise interrupted("1 of 2 jobs finished")
        raise KeyboardInterrupt

    @app.command()
    def other() -> None: ...

    for args, line in (
        (["stage"], "interrupted: stopped by Ctrl-C; finished outputs are kept, rerun to resume"),
        (["stage", "--pool"], "interrupted: 1 of 2 jobs finished"),
    ):
        with pytest.raises(SystemExit) as end:
            app(args, prog_name="dreamgym")
        assert end.value.code == 130
        assert capsys.readouterr().err.splitlines() == [line]


def test_ctrl_c_while_workers_spawn_is_raised_when_spawning_ends_never_lost():
    # another thread (the pool's manager, tqdm's monitor) may take the signal: ignoring
    # SIGINT while spawning lost it there; it must reach the main thread after the block
    import threading

    from components.pool import _spawning

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    reached_end = False
    try:
        with pytest.raises(KeyboardInterrupt), _spawning():
            signal.pthread_kill(other.ident, signal.SIGINT)
            time.sleep(0.2)
            reached_end = True  # not raised inside: a half-submitted pool is worse
    finally:
        stop.set()
    assert reached_end
