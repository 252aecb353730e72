"""Deterministic TextWorld task suite: games per family and difficulty, split by game.

Families (difficulty = the family's knob, spread evenly over ``[min, max]``):

* ``quest``: random quests from TextWorld's generator; quest length = difficulty, with
  more rooms and objects as it grows.
* ``cooking``: ``tw-cooking`` (First TextWorld Problems) recipes; difficulty adds
  ingredients, rooms, closed containers/doors, cooking and cutting (COOKING_LEVELS in
  components/envs/textworld_games.py, which makes, compiles and verifies one game).
* ``treasure``: ``tw-treasure_hunter`` with level = difficulty (1-10: 5 empty rooms,
  11-20: 10 rooms with doors and containers, 21-30: 20 rooms with locked doors and keys).

Everything is a pure function of ``cfg.tasks`` and ``cfg.seed``: task ids, difficulties,
splits and game seeds are planned up front (no TextWorld needed), so the same seed gives
the same suite on any machine. Every game is verified solvable (its walkthrough wins when
replayed); a game that fails generation or verification is regenerated from a seed
derived from the planned one. Finished games are reused, so an interrupted generation
resumes where it stopped.

Layout under ``out_dir``: ``tasks.jsonl`` (one Task per line) and ``games/<task_id>.z8``
with TextWorld's ``<task_id>.json`` beside it and our ``<task_id>.meta.json`` (written last:
its presence marks a finished game). ``Task.game_file`` is relative to the project root.
The games folder's manifest (components/manifest.py) lists the files written here: only
those are ever pruned.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from components.config import Config, TaskFamilyConfig
from components.envs.base import TASKS_FILE, write_task_suite
from components.envs.textworld_games import (
    GAME_EXT,
    GENERATOR_VERSION,
    META_SUFFIX,
    GameSpec,
    build_game,
    int_seed,
)
from components.io import read_json
from components.schema import Split, Task, read_jsonl, stable_id

log = logging.getLogger(__name__)

ENV_NAME = "textworld"
GAMES_DIR = "games"


# -- planning (pure, no TextWorld) ----------------------------------------------------------


def spread_difficulties(n: int, lo: int, hi: int) -> list[int]:
    """``n`` difficulties spread evenly over ``[lo, hi]``, in increasing order."""
    if n == 1:
        return [lo]
    return [lo + round(i * (hi - lo) / (n - 1)) for i in range(n)]


def _split_counts(n: int, train: float, validation: float) -> list[int]:
    n_train = max(1, round(train * n))
    n_val = min(round(validation * n), n - n_train)
    return [n_train, n_val, n - n_train - n_val]


def _evenly(k: int, n: int, offset: float) -> list[int]:
    # k distinct positions spread over range(n): stratifies splits by difficulty
    return sorted({math.floor((j + offset) * n / k) for j in range(k)}) if k else []


def _assign_splits(n: int, counts: list[int], rng: random.Random) -> list[Split]:
    n_train, n_val, n_test = counts
    splits: list[Split] = ["train"] * n
    test = _evenly(n_test, n, rng.random())
    for pos in test:
        splits[pos] = "test"
    rest = [i for i in range(n) if splits[i] != "test"]
    for pos in _evenly(n_val, len(rest), rng.random()):
        splits[rest[pos]] = "validation"
    assert splits.count("train") == n_train
    return splits


def plan_task_suite(cfg: Config) -> list[GameSpec]:
    """The planned games of ``cfg.tasks`` (ids, difficulties, splits, seeds); deterministic."""
    families = cfg.tasks.families
    if len({f.name for f in families}) != len(families):
        raise ValueError("each task family may appear only once in tasks.families")
    if sum(f.n_games for f in families) < 2:
        from components.io import InputError

        raise InputError(
            "the task suite needs at least 2 games (>=1 train and >=1 test): "
            "raise tasks.families[*].n_games"
        )
    split = cfg.tasks.split
    counts = {f.name: _split_counts(f.n_games, split.train, split.validation) for f in families}
    if not any(c[2] for c in counts.values()):
        # Hold out one game of the largest family so the test split is never empty.
        big = max(families, key=lambda f: f.n_games)
        c = counts[big.name]
        if big.n_games >= 2:
            c[1 if c[1] else 0] -= 1
        else:  # every family has a single game: that family loses its train game
            log.warning("all families have 1 game: family %s has no train game", big.name)
            c[0] -= 1
        c[2] += 1
    specs: list[GameSpec] = []
    for fam in families:
        specs.extend(_plan_family(fam, counts[fam.name], cfg.seed))
    return specs


def _plan_family(fam: TaskFamilyConfig, counts: list[int], seed: int) -> Iterator[GameSpec]:
    difficulties = spread_difficulties(fam.n_games, fam.min_difficulty, fam.max_difficulty)
    rng = random.Random(int_seed("splits", seed, fam.name, GENERATOR_VERSION))
    splits = _assign_splits(fam.n_games, counts, rng)
    for i, (d, s) in enumerate(zip(difficulties, splits, strict=True)):
        key = stable_id(ENV_NAME, fam.name, i, d, seed, GENERATOR_VERSION, n=10)
        yield GameSpec(
            task_id=f"tw-{fam.name}-{i:03d}-{key}",
            family=fam.name,
            index=i,
            difficulty=d,
            split=s,
            seed=int_seed("game", seed, fam.name, i, d, GENERATOR_VERSION),
        )


def exit_with_parent(parent_pid: int) -> None:
    """Process-pool initializer: end this worker as soon as its parent dies (kill -9).

    Orphaned pool workers would otherwise finish (and keep writing) their current job,
    racing a resumed run, and then wait forever for more work.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _existing_meta(spec: GameSpec, games_dir: Path) -> dict[str, Any] | None:
    meta_file = games_dir / f"{spec.task_id}{META_SUFFIX}"
    if not meta_file.is_file():
        return None
    for ext in (GAME_EXT, ".json"):
        if not (games_dir / f"{spec.task_id}{ext}").is_file():
            return None
    try:
        meta = read_json(meta_file)
    except (OSError, ValueError):
        return None
    same = meta.get("generator_version") == GENERATOR_VERSION and all(
        meta.get(k) == v for k, v in asdict(spec).items() if k != "split"
    )
    return meta if same and meta.get("walkthrough") else None


def _game_files(task_id: str) -> list[str]:
    return [f"{task_id}{ext}" for ext in (".json", GAME_EXT, META_SUFFIX)]


def _prune(games_dir: Path, keep: set[str]) -> int:
    # Files of games no longer planned, among those this generator wrote (its manifest):
    # any other file in the folder (a user's game, notes) is never deleted.
    from components import manifest

    gone = [n for n in manifest.read_manifest(games_dir) if n.split(".", 1)[0] not in keep]
    for name in gone:
        (games_dir / name).unlink(missing_ok=True)
    if gone:
        manifest.forget(games_dir, gone)
    shutil.rmtree(games_dir / ".tmp", ignore_errors=True)
    return len(gone)


def record_games(games_dir: Path, task_ids: list[str]) -> None:
    """List the files of these generated games in the games folder's manifest."""
    from components import manifest

    manifest.record(games_dir, [n for t in task_ids for n in _game_files(t)], hashed=False)


def _game_path(out_dir: Path, root: Path, task_id: str) -> str:
    game = (out_dir / GAMES_DIR / f"{task_id}{GAME_EXT}").resolve()
    try:
        return game.relative_to(root.resolve()).as_posix()
    except ValueError:
        raise ValueError(
            f"out_dir {out_dir} is not under root {root}: pass the project root as root"
        ) from None


def generate_task_suite(
    cfg: Config, out_dir: Path, progress: bool = True, root: Path | None = None
) -> list[Task]:
    """Generate (or reuse) every planned game and write ``out_dir/tasks.jsonl``.

    ``root`` is the project root that ``Task.game_file`` is relative to (default: cwd).
    """
    from components.progress import progress_bar

    root = Path(root) if root is not None else Path.cwd()
    out_dir = Path(out_dir)
    games_dir = out_dir / GAMES_DIR
    games_dir.mkdir(parents=True, exist_ok=True)
    specs = plan_task_suite(cfg)
    _game_path(out_dir, root, "probe")  # fail fast on a bad root, before slow generation
    metas = {s.task_id: m for s in specs if (m := _existing_meta(s, games_dir)) is not None}
    # a finished game (our meta beside it) is ours: listed so a later plan may prune it
    record_games(games_dir, list(metas))
    n_pruned = _prune(games_dir, {s.task_id for s in specs})
    if n_pruned:
        log.info("removed %d files of games no longer in the plan", n_pruned)
    # hardest first: the slowest games start early, so workers finish together
    todo = sorted((s for s in specs if s.task_id not in metas), key=lambda s: -s.difficulty)
    log.info(
        "task suite: %d games planned, %d reused, %d to generate", len(specs), len(metas), len(todo)
    )
    if todo:
        bar = progress_bar(
            total=len(todo), desc="generate games", unit="game", disable=not progress
        )
        # always in spawned processes: nothing leaks between games, same results any worker
        # count; a worker that dies raises BrokenProcessPool instead of hanging; on Ctrl-C
        # the workers stop at once and the games built so far are kept for the rerun
        from concurrent.futures import as_completed

        from components.pool import interrupted, interruptible_pool, submit_all

        built = 0
        try:
            with interruptible_pool(min(cfg.tasks.workers, len(todo))) as pool:
                futures = submit_all(pool, build_game, [(spec, games_dir) for spec in todo])
                for future in as_completed(futures):
                    meta = future.result()
                    metas[meta["task_id"]] = meta
                    record_games(games_dir, [meta["task_id"]])
                    built += 1
                    bar.update(1)
        except KeyboardInterrupt:
            bar.close()
            raise interrupted(f"{built} of {len(todo)} games built; rerun to resume") from None
        bar.close()
        shutil.rmtree(games_dir / ".tmp", ignore_errors=True)
    modes = {f.name: f.instruction for f in cfg.tasks.families}
    tasks = [_task(s, metas[s.task_id], out_dir, root, modes[s.family]) for s in specs]
    long = [t.task_id for t in tasks if len(t.walkthrough or []) > cfg.env.max_steps]
    if long:
        log.warning("%d games need more than env.max_steps steps: %s", len(long), long)
    write_task_suite(out_dir, tasks)
    return tasks


_LEAD = re.compile(r"^[^,]{0,60},\s+")  # "And then, " / "If you can succeed at that, "


def goal_sentence(objective: str, walkthrough: list[str]) -> str:
    """The objective's sentence naming what its last command acts on, without its lead-in.

    TextWorld's objectives list every step ("First, go east. Then ... And then, retrieve
    the insect from the floor of the pantry."); the goal keeps only where the task ends.
    """
    last = walkthrough[-1] if walkthrough else ""
    target = last.split(" ", 1)[1] if " " in last else last
    for prep in (" from ", " into ", " on ", " with ", " in "):
        target = target.split(prep, 1)[0]
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", objective) if s.strip()]
    found = [s for s in sentences if target and target.lower() in s.lower()]
    if not found:
        return objective
    sentence = found[-1]
    while (lead := _LEAD.match(sentence)) and target.lower() not in lead.group(0).lower():
        sentence = sentence[lead.end() :]
    return sentence[:1].upper() + sentence[1:]


def _task(
    spec: GameSpec, meta: dict[str, Any], out_dir: Path, root: Path, mode: str = "walkthrough"
) -> Task:
    instruction = meta["instruction"]
    if mode == "goal":
        instruction = goal_sentence(instruction, list(meta["walkthrough"]))
    return Task(
        task_id=spec.task_id,
        env=ENV_NAME,
        family=spec.family,
        difficulty=spec.difficulty,
        split=spec.split,
        instruction=instruction,
        seed=int(meta["game_seed"]),
        game_file=_game_path(out_dir, root, spec.task_id),
        walkthrough=list(meta["walkthrough"]),
    )


def load_task_suite(out_dir: Path) -> list[Task]:
    """Read ``out_dir/tasks.jsonl``."""
    return list(read_jsonl(Path(out_dir) / TASKS_FILE, Task))
