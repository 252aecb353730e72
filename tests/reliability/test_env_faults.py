"""Case 6, env faults: a real TextWorld engine that dies is restarted, its episode failed.

TextWorld runs ``.z8`` games in-process (jericho's frotz interpreter, a C library), so
"the env process" is the process hosting the engine: inside one process the engine can
stop under the env (EnvError), and in collection the host is a pool worker that can be
killed (kill -9) or taken down by the interpreter itself (frotz calls exit(1) on a
corrupt story file). Each case must end with every planned episode collected exactly
once, or counted as failed, never a hang or a half-written record.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from components.data.collect import collect, plan_episodes
from components.envs.base import EnvError
from components.envs.textworld_env import TextWorldEnv, story_file_problem
from components.schema import Trajectory, read_jsonl
from tests.integration.textworld_suite import Suite
from tests.procs import children
from tests.reliability.project import (
    child_env,
    kill9,
    python_argv,
    spawn,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _episodes(out: Path) -> list[Trajectory]:
    return [t for p in sorted(out.glob("*.jsonl")) for t in read_jsonl(p, Trajectory)]


def test_engine_dying_mid_episode_is_an_env_error_and_reset_restarts(tw_suite: Suite) -> None:
    task = tw_suite.tasks[0]
    env = TextWorldEnv(max_steps=tw_suite.cfg.env.max_steps, root=tw_suite.root)
    env.reset(task)
    env.step("look")  # the episode is running (looking never ends it)
    # the interpreter goes away under the env (as if its host had lost it)
    env._tw.unwrapped.close()
    with pytest.raises(EnvError, match="failed on"):
        env.step("look")
    with pytest.raises(RuntimeError):
        env.step("look")  # the failed episode is over, not silently continued
    # the next reset starts a fresh engine and the game plays to the end
    env.reset(task)
    reward, done = 0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(env.expert_action() or "look")
        done = terminated or truncated
    assert reward == 1
    env.close()


_COLLECT = """
import json, sys
from pathlib import Path
from components.config import Config
from components.data.collect import collect
from components.envs.textworld_tasks import load_task_suite
cfg = Config.model_validate_json(Path(sys.argv[1]).read_text())
root = Path(sys.argv[2])
summary = collect(cfg, load_task_suite(root / "data" / "tasks"), Path(sys.argv[3]), root, False)
print("SUMMARY " + json.dumps(summary))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_killed_collection_worker_is_restarted_and_nothing_is_lost(
    tw_suite: Suite, tmp_path: Path
) -> None:
    cfg = tw_suite.cfg  # 2 worker processes
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(cfg.model_dump_json())
    out = tmp_path / "raw"
    log = tmp_path / "collect.log"
    argv = python_argv(_COLLECT, str(cfg_file), str(tw_suite.root), str(out))
    proc = spawn(argv, child_env(), log)
    try:
        wait_until(
            lambda: (
                any(p.read_bytes().count(b"\n") for p in out.glob("*.jsonl"))
                and bool(children(proc.pid, pool_workers_only=True))
            ),
            proc,
            what="a first episode and live workers",
        )
        victim = children(proc.pid, pool_workers_only=True)[0]
        os.kill(victim, signal.SIGKILL)  # the process hosting a game engine dies
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill9(proc)
    text = log.read_text()
    summary = json.loads(text.split("SUMMARY ", 1)[1].splitlines()[0])
    plans = plan_episodes(cfg, tw_suite.tasks)
    trajs = _episodes(out)
    ids = [t.episode_id for t in trajs]
    assert summary["n_worker_crashes"] == 1, text[-2000:]
    assert len(ids) == len(set(ids)) == len(plans) == summary["n_trajectories"]
    assert set(ids) == {p.episode_id for p in plans}
    assert summary["n_env_errors"] == 0
    print(
        f"\n[env faults] worker killed: {len(plans)} episodes planned, {len(ids)} collected, "
        f"lost=0 duplicated=0, torn lines repaired={summary['n_torn_lines']}"
    )


def test_corrupt_game_fails_its_episodes_not_the_run(tw_suite: Suite, tmp_path: Path) -> None:
    """A story file that would make the interpreter exit(1) is refused before it loads."""
    import shutil

    root = tmp_path / "proj"
    shutil.copytree(tw_suite.root / "data", root / "data")
    victim = tw_suite.tasks[0]
    game = Path(victim.game_file or "")
    game = game if game.is_absolute() else root / game
    good = game.read_bytes()
    game.write_bytes(good[: len(good) // 3])  # truncated, e.g. a copy cut short
    assert "truncated" in (story_file_problem(game) or "")

    inline = tw_suite.cfg.collect.model_copy(update={"workers": 1})
    cfg = tw_suite.cfg.model_copy(update={"collect": inline})
    plans = plan_episodes(cfg, tw_suite.tasks)
    n_victim = sum(p.task_id == victim.task_id for p in plans)
    out = root / "raw"
    # inline: the engine would run in this very process, so a crash would end the test run
    summary = collect(cfg, tw_suite.tasks, out, root, progress=False)
    assert summary["n_env_errors"] == n_victim
    assert summary["n_trajectories"] == len(plans) - n_victim
    assert not (out / f"{victim.task_id}.jsonl").exists() or not _episodes_of(out, victim)

    game.write_bytes(good)  # repaired: the rerun collects exactly the missing episodes
    again = collect(cfg, tw_suite.tasks, out, root, progress=False)
    assert again["n_new_trajectories"] == n_victim and again["n_env_errors"] == 0
    ids = [t.episode_id for t in _episodes(out)]
    assert len(ids) == len(set(ids)) == len(plans)


def _episodes_of(out: Path, task) -> list[Trajectory]:
    return [t for t in _episodes(out) if t.task_id == task.task_id]


def test_textworld_env_refuses_a_corrupt_story_file_in_process(
    tw_suite: Suite, tmp_path: Path
) -> None:
    """TextWorldEnv checks the story file before frotz loads it (frotz would exit(1) here)."""
    import shutil

    task = tw_suite.tasks[0]
    env = TextWorldEnv(max_steps=tw_suite.cfg.env.max_steps, root=tw_suite.root)
    source = env.resolve_game_file(task)
    game = tmp_path / source.name
    shutil.copy(source.with_suffix(".json"), game.with_suffix(".json"))
    good = source.read_bytes()
    broken = task.model_copy(update={"game_file": str(game)})
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF  # one garbled byte: the header checksum no longer adds up
    cases = [
        (good[: len(good) // 3], "truncated"),
        (bytes(flipped), "checksum mismatch"),
        (b"<html>not a game</html>" * 4, "not a Z-machine story file"),
    ]
    try:
        for data, reason in cases:
            game.write_bytes(data)
            with pytest.raises(EnvError, match=reason):
                env.reset(broken)  # this process would have died inside the interpreter
        game.unlink()
        with pytest.raises(EnvError, match="not found"):
            env.reset(broken)
        # the same env instance still plays a sound game to the end
        game.write_bytes(good)
        env.reset(broken)
        done, reward = False, 0
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.expert_action() or "look")
            done = terminated or truncated
        assert reward == 1
    finally:
        env.close()
