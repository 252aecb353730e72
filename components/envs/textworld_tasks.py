"""Deterministic TextWorld task suite: games per family and difficulty, split by game.

Families (difficulty = the family's knob, spread evenly over ``[min, max]``):

* ``quest``: random quests from TextWorld's generator; quest length = difficulty, with
  more rooms and objects as it grows.
* ``cooking``: ``tw-cooking`` (First TextWorld Problems) recipes; difficulty adds
  ingredients, rooms, closed containers/doors, cooking and cutting (see COOKING_LEVELS).
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

import contextlib
import copy
import functools
import json
import logging
import math
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.config import Config, TaskFamilyConfig
from components.envs.base import TASKS_FILE, write_task_suite
from components.envs.textworld_speedups import ni_without_index, use_keyed_fact_sort
from components.io import read_json
from components.schema import Split, Task, read_jsonl, stable_id

log = logging.getLogger(__name__)

ENV_NAME = "textworld"
GAMES_DIR = "games"
GAME_EXT = ".z8"
META_SUFFIX = ".meta.json"
# Part of every task id and game seed: bump it when the generation recipe changes so old
# games are not silently reused under the same ids.
GENERATOR_VERSION = "tw-suite-1"
MAX_ATTEMPTS = 20

# tw-cooking skills per difficulty (FTWP-like progression); higher difficulties reuse the last
COOKING_LEVELS: tuple[dict[str, Any], ...] = (
    {"recipe": 1, "take": 1, "go": 1},
    {"recipe": 1, "take": 1, "go": 1, "open": True, "cut": True},
    {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True},
    {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True, "cut": True},
    {"recipe": 3, "take": 3, "go": 9, "open": True, "cook": True, "cut": True},
    {"recipe": 3, "take": 3, "go": 12, "open": True, "cook": True, "cut": True, "drop": True},
)


@dataclass(frozen=True)
class GameSpec:
    """One planned game: identity, difficulty, split and the seed it is generated from."""

    task_id: str
    family: str
    index: int
    difficulty: int
    split: Split
    seed: int


# -- planning (pure, no TextWorld) ----------------------------------------------------------


def _int_seed(*parts: object) -> int:
    return int(stable_id(*parts), 16) % (2**31 - 1)


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
    rng = random.Random(_int_seed("splits", seed, fam.name, GENERATOR_VERSION))
    splits = _assign_splits(fam.n_games, counts, rng)
    for i, (d, s) in enumerate(zip(difficulties, splits, strict=True)):
        key = stable_id(ENV_NAME, fam.name, i, d, seed, GENERATOR_VERSION, n=10)
        yield GameSpec(
            task_id=f"tw-{fam.name}-{i:03d}-{key}",
            family=fam.name,
            index=i,
            difficulty=d,
            split=s,
            seed=_int_seed("game", seed, fam.name, i, d, GENERATOR_VERSION),
        )


# -- generation (TextWorld, runs in worker processes) ---------------------------------------


def _make_game(family: str, difficulty: int, seed: int) -> Any:
    import textworld
    import textworld.challenges
    from textworld.generator import make_game

    use_keyed_fact_sort()  # the same games, made sooner

    options = textworld.GameOptions()
    options.seeds = seed
    if family == "quest":
        options.nb_rooms = 1 + (difficulty + 1) // 2
        options.nb_objects = 2 + 2 * difficulty
        options.quest_length = difficulty
        return make_game(options)
    if family == "treasure":
        make = textworld.challenges.CHALLENGES["tw-treasure_hunter"][1]
        with _knowledge_base_parsed_once():
            return make({"level": min(max(difficulty, 1), 30)}, options)
    if family == "cooking":
        make = textworld.challenges.CHALLENGES["tw-cooking"][1]
        level = COOKING_LEVELS[min(difficulty, len(COOKING_LEVELS)) - 1]
        return make({**level, "recipe_seed": 0, "split": None}, options)
    raise ValueError(f"unknown task family {family!r}")


@functools.cache
def _treasure_knowledge_base() -> Any:
    from textworld.challenges.tw_treasure_hunter.treasure_hunter import KB_PATH
    from textworld.generator.data import KnowledgeBase

    return KnowledgeBase.load(KB_PATH)


@contextlib.contextmanager
def _knowledge_base_parsed_once() -> Iterator[None]:
    """The treasure hunter's ``make`` re-parses its knowledge base for every game (~0.4 s,
    ~14% of making one): while this is open it gets a copy of one parse per process. A
    copy, so a game that changed its KB cannot leak into the next (same games, tested)."""
    from textworld.challenges.tw_treasure_hunter import treasure_hunter

    class _Parsed:
        @staticmethod
        def load(*_: Any, **__: Any) -> Any:
            return copy.deepcopy(_treasure_knowledge_base())

    original = treasure_hunter.KnowledgeBase
    treasure_hunter.KnowledgeBase = _Parsed  # make() reads the module global
    try:
        yield
    finally:
        treasure_hunter.KnowledgeBase = original


def _compile(game: Any, path: Path) -> None:
    import textworld
    from textworld.generator import compile_game

    # set iteration order leaks into this metadata list; sort it for byte-identical files
    if isinstance(game.metadata.get("entities"), list):
        game.metadata["entities"] = sorted(game.metadata["entities"], key=lambda e: str(e))
    options = textworld.GameOptions()
    options.path = str(path)
    options.force_recompile = True
    with ni_without_index():  # the same story file, ~18% sooner
        compile_game(game, options)


def verify_walkthrough(game_file: Path, walkthrough: list[str] | None) -> list[str] | None:
    """A command list that wins ``game_file``: the walkthrough if replaying it wins, else
    the engine's winning policy followed step by step; None if neither wins."""
    import textworld

    use_keyed_fact_sort()
    infos = textworld.EnvInfos(policy_commands=True, won=True, lost=True)
    env = textworld.start(str(game_file), request_infos=infos)
    try:
        if walkthrough:
            state = env.reset()
            for i, cmd in enumerate(walkthrough):
                state, _, done = env.step(cmd)
                if done:
                    if state["won"]:
                        return list(walkthrough[: i + 1])
                    break
        state = env.reset()
        played: list[str] = []
        for _ in range(4 * len(walkthrough or []) + 20):
            plan = state.get("policy_commands") or []
            if not plan:
                return None
            played.append(plan[0])
            state, _, done = env.step(plan[0])
            if done:
                return played if state["won"] else None
        return None
    finally:
        env.close()


def build_game(spec: GameSpec, games_dir: Path) -> dict[str, Any]:
    """Generate, compile and verify one game (retrying derived seeds); returns its meta."""
    tmp = games_dir / ".tmp" / spec.task_id
    errors: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        seed = spec.seed if attempt == 0 else _int_seed("retry", spec.seed, attempt)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        start = time.perf_counter()
        try:
            game = _make_game(spec.family, spec.difficulty, seed)
            tmp_file = tmp / f"{spec.task_id}{GAME_EXT}"
            _compile(game, tmp_file)
            walkthrough = verify_walkthrough(tmp_file, game.walkthrough)
        except Exception as err:  # TextWorld raises many kinds on unlucky seeds
            errors.append(f"seed {seed}: {type(err).__name__}: {err}")
            continue
        if not walkthrough:
            errors.append(f"seed {seed}: walkthrough does not win")
            continue
        meta = {
            **asdict(spec),
            "generator_version": GENERATOR_VERSION,
            "game_seed": seed,
            "attempts": attempt + 1,
            "instruction": " ".join(str(game.objective).split()),
            "walkthrough": walkthrough,
            "seconds": round(time.perf_counter() - start, 3),
        }
        # json before z8, the meta file last: its presence means the game is complete
        for ext in (".json", GAME_EXT):
            os.replace(tmp / f"{spec.task_id}{ext}", games_dir / f"{spec.task_id}{ext}")
        _write_text_atomic(games_dir / f"{spec.task_id}{META_SUFFIX}", json.dumps(meta))
        shutil.rmtree(tmp, ignore_errors=True)
        return meta
    shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"no solvable game for {spec.task_id}: " + "; ".join(errors[-3:]))


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


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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
