"""One TextWorld game: made from a family, a difficulty and a seed, compiled and verified.

``build_game`` is what the task suite's worker processes run (components/envs/
textworld_tasks.py plans the specs): it makes the game with TextWorld's generator
(``quest``) or challenge (``cooking``, ``treasure``), compiles it to ``<task_id>.z8``
with TextWorld's ``<task_id>.json`` beside it, and keeps it only if its walkthrough (or
the engine's winning policy) wins when replayed; a seed that fails is replaced by one
derived from it, up to ``MAX_ATTEMPTS``. The files are made in ``games/.tmp`` and moved
in, our ``<task_id>.meta.json`` last: its presence marks a finished game.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.envs.textworld_speedups import ni_without_index, use_keyed_fact_sort
from components.schema import Split, stable_id

GAME_EXT = ".z8"
META_SUFFIX = ".meta.json"
# Part of every task id and game seed: bump it when the generation recipe changes so old
# games are not silently reused under the same ids.
GENERATOR_VERSION = "tw-suite-1"
MAX_ATTEMPTS = 20  # seeds tried per game

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


def int_seed(*parts: object) -> int:
    """A game seed (31 bits) that is a pure function of ``parts``."""
    return int(stable_id(*parts), 16) % (2**31 - 1)


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
        seed = spec.seed if attempt == 0 else int_seed("retry", spec.seed, attempt)
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


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
