"""Collect real TextWorld trajectories with expert / noisy / random policies, resumably.

The plan is ``cfg.collect.episodes[policy]`` episodes per game of the splits in
``cfg.collect.splits`` (the test split only if configured). Episode ids and seeds are
pure functions of (task, policy, episode index, seed, the policy's parameters, the step
limit), so a rerun plans the same episodes.

Output: ``out_dir/<task_id>.jsonl``, one Trajectory per line, each line flushed as soon
as its episode ends; one game is written by one process at a time. Resuming after a
crash (even ``kill -9``) drops a torn last line, keeps finished episodes, drops records
that are not in the current plan (logged), and runs only what is missing: no episode is
lost or written twice. The same resume runs inside one call when a worker process (and
the game engine it hosts) dies mid-episode: the pool is restarted (``n_worker_crashes``),
the interrupted episode, never written, is played again from its start.

Ctrl-C (SIGINT) is the parent's alone (components/pool.py): it stops submitting, cancels
the games not started, terminates the workers, keeps every finished episode (a line torn
by the termination is dropped by the next run), prints ``interrupted: N of M episodes
done; rerun to resume`` and exits with code 130.
"""

from __future__ import annotations

import fcntl
import json
import logging
import random
import time
from collections import Counter, defaultdict
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from components.config import Config
from components.data.policies import POLICIES, ExpertEnv, behaviour_key, make_policy
from components.envs.base import ADMISSIBLE, VALID, EnvError, step_won
from components.envs.textworld_env import story_file_problem
from components.episodes import task_trajectory, task_transition
from components.io import atomic_write_bytes, remove_stale_temps
from components.schema import Provenance, Task, Trajectory, stable_id

log = logging.getLogger(__name__)

SOURCE = "real"
ENV_RETRIES = 1  # an episode whose env fails is retried once on a fresh engine, then skipped
MAX_WORKER_RESTARTS = 2  # a pool whose worker process died is restarted this often, then stop


@dataclass(frozen=True)
class EpisodePlan:
    """One planned episode."""

    episode_id: str
    task_id: str
    policy: str
    index: int
    seed: int


def demo_task_ids(cfg: Config, tasks: list[Task]) -> set[str]:
    """The train games whose demonstrations are collected: ``collect.demo_games`` of them,
    drawn per family in proportion to its size (seeded), or all when it is None."""
    train = sorted((t for t in tasks if t.split == "train"), key=lambda t: t.task_id)
    n = cfg.collect.demo_games
    if n is None or n >= len(train):
        return {t.task_id for t in train}
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in train:
        by_family[t.family].append(t)
    rng = random.Random(cfg.seed)
    chosen: set[str] = set()
    families = sorted(by_family)
    quotas = {f: max(1, round(n * len(by_family[f]) / len(train))) for f in families}
    for f in families:
        chosen.update(
            t.task_id for t in rng.sample(by_family[f], min(quotas[f], len(by_family[f])))
        )
    return chosen


def plan_episodes(cfg: Config, tasks: list[Task]) -> list[EpisodePlan]:
    """Every episode to collect, in a deterministic order (never the unlisted splits)."""
    c = cfg.collect
    demos = demo_task_ids(cfg, tasks)
    plans = []
    for task in sorted(tasks, key=lambda t: t.task_id):
        if task.split not in c.splits:
            continue
        mix = (
            c.explore_episodes
            if task.split == "train" and task.task_id not in demos
            else c.episodes
        )
        for policy in POLICIES:
            key = behaviour_key(policy, c.epsilon, c.p_invalid)
            for i in range(mix.get(policy, 0)):
                # round 0 keeps the ids of runs made before rounds existed
                fresh = ("round", c.round) if c.round else ()
                eid = stable_id(
                    "episode", task.task_id, policy, i, cfg.seed, *key, cfg.env.max_steps, *fresh
                )
                seed = int(stable_id("episode-seed", eid), 16) % (2**31 - 1)
                plans.append(EpisodePlan(eid, task.task_id, policy, i, seed))
    return plans


def run_episode(
    env: ExpertEnv, task: Task, plan: EpisodePlan, epsilon: float, p_invalid: float
) -> Trajectory:
    """Play one episode of ``task`` with the planned policy; returns its trajectory."""
    policy = make_policy(plan.policy, plan.seed, epsilon, p_invalid)
    provenance = Provenance(policy=plan.policy, iteration=0, seed=plan.seed)
    obs, info = env.reset(task, seed=plan.seed)
    initial, steps = obs, []
    terminated = truncated = False
    while not (terminated or truncated):
        action = policy.act(info, env)
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        i = len(steps)
        steps.append(
            task_transition(
                task,
                plan.episode_id,
                i,
                obs,
                action,
                next_obs,
                reward=int(step_won(next_info, reward)),  # a win, not a partial score
                done=terminated or truncated,
                admissible_actions=list(info.get(ADMISSIBLE) or []),
                valid_action=bool(next_info[VALID]),
                source=SOURCE,
                provenance=provenance,
            )
        )
        obs, info = next_obs, next_info
    return task_trajectory(task, steps, initial, truncated=truncated and not terminated)


# -- per-game work (runs in a worker process, or inline with one worker) -------------------


def _new_stats() -> dict[str, Any]:
    return {"n": Counter(), "success": Counter(), "steps": 0, "env_errors": 0, "seconds": 0.0}


def _collect_game(job: dict[str, Any]) -> dict[str, Any]:
    from components.config import EnvConfig
    from components.envs import make_env

    task = Task.model_validate(job["task"])
    stats = _new_stats()
    game = Path(task.game_file or "")
    if game.suffix.startswith(".z"):  # a Z-machine game (TextWorld), relative to the root
        problem = story_file_problem(game if game.is_absolute() else Path(job["root"]) / game)
        if problem is not None:
            # every episode of this game is a failure; the other games go on
            log.error("skipping %d episodes of %s: %s", len(job["episodes"]), task.task_id, problem)
            stats["env_errors"] += len(job["episodes"])
            return stats
    # the env of cfg.env.name (textworld, scienceworld, miniwob, an AgentGym adapter)
    env: Any = make_env(EnvConfig.model_validate(job["env"]), Path(job["root"]), expert=True)
    start = time.perf_counter()
    try:
        with Path(job["path"]).open("a", encoding="utf-8") as f:
            # exclusive while writing: a resumed run waits for a dying orphan to let go
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            for raw in job["episodes"]:
                plan = EpisodePlan(**raw)
                traj = None
                for attempt in range(ENV_RETRIES + 1):
                    try:
                        traj = run_episode(env, task, plan, job["epsilon"], job["p_invalid"])
                        break
                    except EnvError as err:
                        log.warning("env error on %s (try %d): %s", plan.episode_id, attempt, err)
                        env.close()
                if traj is None:
                    stats["env_errors"] += 1
                    continue
                # one whole line per episode, flushed: a kill can only tear the last line
                f.write(traj.model_dump_json() + "\n")
                f.flush()
                stats["n"][traj.policy] += 1
                stats["success"][traj.policy] += int(traj.success)
                stats["steps"] += traj.n_steps
    finally:
        env.close()
    stats["seconds"] = time.perf_counter() - start
    return stats


# -- resume ------------------------------------------------------------------------------------


@dataclass
class _Existing:
    done: dict[str, set[str]]  # task_id -> episode ids already on disk
    stats: dict[str, Any]
    dropped: int = 0
    torn: int = 0


def _scan(out_dir: Path, planned: dict[str, set[str]], splits: dict[str, str]) -> _Existing:
    """Repair the output files and find which planned episodes are already collected."""
    found = _Existing(done=defaultdict(set), stats=_new_stats())
    remove_stale_temps(out_dir)  # a rewrite below that was interrupted
    for tmp in out_dir.glob("*.jsonl.tmp"):  # the same, by a version before unique names
        tmp.unlink()
    for path in sorted(out_dir.glob("*.jsonl")):
        task_id = path.stem
        with path.open("rb") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # no writer left on this file
            data = original = fh.read()
        if task_id not in planned:
            found.dropped += data.count(b"\n")
            path.unlink()
            continue
        if data and not data.endswith(b"\n"):
            found.torn += 1
            data = data[: data.rfind(b"\n") + 1]
        keep: list[bytes] = []
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                traj = Trajectory.model_validate_json(line)
            except (ValidationError, ValueError):
                found.dropped += 1
                continue
            eid = traj.episode_id
            stale = traj.task_id != task_id or traj.split != splits[task_id]
            if stale or eid not in planned[task_id] or eid in found.done[task_id]:
                found.dropped += 1
                continue
            found.done[task_id].add(eid)
            found.stats["n"][traj.policy] += 1
            found.stats["success"][traj.policy] += int(traj.success)
            found.stats["steps"] += traj.n_steps
            keep.append(line + b"\n")
        new = b"".join(keep)
        if new != original:
            atomic_write_bytes(path, new)
    return found


# -- entry point ---------------------------------------------------------------------------------


def collect(
    cfg: Config, tasks: list[Task], out_dir: Path, root: Path, progress: bool = True
) -> dict[str, Any]:
    """Collect the planned episodes under ``out_dir`` (resumable); returns a summary.

    Ctrl-C raises ``Interrupted`` (a ``SystemExit`` with code 130) once the workers are
    stopped; the episodes finished so far are kept for the next run to resume from.
    """
    from components.pool import interrupted

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    c = cfg.collect
    if "test" in c.splits:
        log.warning("collect.splits includes 'test': held-out games will be collected")
    by_id = {t.task_id: t for t in tasks}
    splits = {t.task_id: t.split for t in tasks}
    plans = plan_episodes(cfg, tasks)
    if not plans:  # resuming prunes what the plan lacks: an empty plan would drop it all
        from components.io import InputError

        raise InputError(
            f"nothing to collect: {len(tasks)} tasks, no episode planned for the splits "
            f"{list(c.splits)}; {out_dir} left as it is"
        )
    planned: dict[str, set[str]] = defaultdict(set)
    for p in plans:
        planned[p.task_id].add(p.episode_id)
    try:
        return _collect_missing(cfg, tasks, by_id, splits, plans, planned, out_dir, root, progress)
    except KeyboardInterrupt:
        # the workers are gone (the pool stops them on the way out): count what is on disk
        done = _count_done(out_dir, planned)
        raise interrupted(f"{done} of {len(plans)} episodes done; rerun to resume") from None


def _collect_missing(
    cfg: Config,
    tasks: list[Task],
    by_id: dict[str, Task],
    splits: dict[str, str],
    plans: list[EpisodePlan],
    planned: dict[str, set[str]],
    out_dir: Path,
    root: Path,
    progress: bool,
) -> dict[str, Any]:
    from concurrent.futures.process import BrokenProcessPool

    c = cfg.collect
    start = time.perf_counter()
    resumed: int | None = None
    dropped = torn = crashes = env_errors = 0
    while True:
        # (re)scan: after a worker died this also repairs the line it tore and counts the
        # episodes it finished, so the restarted pool runs only what is still missing
        existing = _scan(out_dir, planned, splits)
        dropped, torn = dropped + existing.dropped, torn + existing.torn
        if resumed is None:
            resumed = sum(existing.stats["n"].values())
        if existing.dropped or existing.torn:
            log.warning(
                "resume: dropped %d records not in the plan (or invalid/duplicated), %d torn lines",
                existing.dropped,
                existing.torn,
            )
        jobs = _jobs(cfg, by_id, plans, existing, root, out_dir)
        new = _new_stats()
        try:
            _run_all(jobs, c.workers, new, progress)
            break
        except BrokenProcessPool as err:
            # a worker (and the game engine inside it) died mid-episode, e.g. killed or out
            # of memory: its unfinished episode is a failure, nothing of it is written
            crashes += 1
            env_errors += new["env_errors"]
            if crashes > MAX_WORKER_RESTARTS:
                raise RuntimeError(
                    f"collection workers died {crashes} times ({err}); the episodes collected "
                    f"so far are kept in {out_dir}: rerun to resume"
                ) from err
            log.warning("a collection worker died (%s): restarting the pool", err)
    new["env_errors"] += env_errors
    wall = time.perf_counter() - start
    if new["env_errors"]:
        log.warning("%d episodes skipped after env errors (rerun to retry)", new["env_errors"])
    return _summary(tasks, existing, new, wall, resumed, dropped, torn, crashes)


def _count_done(out_dir: Path, planned: dict[str, set[str]]) -> int:
    """Planned episodes with a whole line on disk (what a rerun will keep)."""
    done = 0
    for task_id, ids in planned.items():
        try:
            data = (out_dir / f"{task_id}.jsonl").read_bytes()
        except OSError:
            continue
        seen: set[str] = set()
        for line in data[: data.rfind(b"\n") + 1].splitlines():  # not a torn last line
            try:
                eid = json.loads(line).get("episode_id")
            except (ValueError, AttributeError):
                continue
            if eid in ids:
                seen.add(eid)
        done += len(seen)
    return done


def _jobs(
    cfg: Config,
    by_id: dict[str, Task],
    plans: list[EpisodePlan],
    existing: _Existing,
    root: Path,
    out_dir: Path,
) -> list[dict[str, Any]]:
    """One job per game with planned episodes not yet on disk."""
    pending: dict[str, list[EpisodePlan]] = defaultdict(list)
    for p in plans:
        if p.episode_id not in existing.done[p.task_id]:
            pending[p.task_id].append(p)
    n_pending = sum(len(v) for v in pending.values())
    log.info(
        "collect: %d episodes planned over %d games, %d already done, %d to run",
        len(plans),
        len({p.task_id for p in plans}),
        len(plans) - n_pending,
        n_pending,
    )
    return [
        {
            "task": by_id[tid].model_dump(mode="json"),
            "episodes": [asdict(p) for p in eps],
            "path": str(out_dir / f"{tid}.jsonl"),
            "max_steps": cfg.env.max_steps,
            "env": cfg.env.model_dump(mode="json"),
            "root": str(root),
            "epsilon": cfg.collect.epsilon,
            "p_invalid": cfg.collect.p_invalid,
        }
        # hardest games first so the workers finish together
        for tid, eps in sorted(pending.items(), key=lambda kv: (-by_id[kv[0]].difficulty, kv[0]))
    ]


def _run_all(jobs: list[dict[str, Any]], workers: int, new: dict[str, Any], progress: bool) -> None:
    """Run the jobs, adding each finished game's stats to ``new``."""
    from components.progress import progress_bar

    total = sum(len(j["episodes"]) for j in jobs)
    # closing: an interrupt while this loop holds a result still stops the pool now
    with (
        progress_bar(total=total, desc="collect", unit="ep", disable=not progress) as bar,
        closing(_run_jobs(jobs, workers)) as results,
    ):
        for stats in results:
            for key in ("n", "success"):
                new[key].update(stats[key])
            new["steps"] += stats["steps"]
            new["env_errors"] += stats["env_errors"]
            bar.update(sum(stats["n"].values()) + stats["env_errors"])


def _run_jobs(jobs: list[dict[str, Any]], workers: int) -> Any:
    if not jobs:
        return
    if workers <= 1 or len(jobs) == 1:
        for job in jobs:
            yield _collect_game(job)
        return
    from concurrent.futures import as_completed

    from components.pool import interruptible_pool, submit_all

    # spawned workers that ignore SIGINT; an interrupt (or an error, or closing this
    # generator) cancels the games not started and terminates the workers at once
    with interruptible_pool(min(workers, len(jobs))) as pool:
        futures = submit_all(pool, _collect_game, [(job,) for job in jobs])
        for future in as_completed(futures):
            yield future.result()


def _summary(
    tasks: list[Task],
    existing: _Existing,
    new: dict[str, Any],
    wall: float,
    resumed: int,
    dropped: int,
    torn: int,
    crashes: int,
) -> dict[str, Any]:
    n = existing.stats["n"] + new["n"]
    success = existing.stats["success"] + new["success"]
    n_total = sum(n.values())
    splits = Counter(t.split for t in tasks)
    return {
        "n_trajectories": n_total,
        "n_transitions": existing.stats["steps"] + new["steps"],
        "policies": {
            p: {"n": n[p], "success_rate": round(success[p] / n[p], 4) if n[p] else 0.0}
            for p in POLICIES
            if n[p]
        },
        "n_games": {s: splits.get(s, 0) for s in ("train", "validation", "test")},
        "n_new_trajectories": n_total - resumed,
        "n_resumed_trajectories": resumed,
        "n_dropped_records": dropped,
        "n_torn_lines": torn,
        "n_env_errors": new["env_errors"],
        "n_worker_crashes": crashes,
        "steps_per_s": round(new["steps"] / wall, 2) if new["steps"] and wall > 0 else 0.0,
        "seconds": round(wall, 2),
    }
