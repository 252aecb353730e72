"""Making TextWorld games as TextWorld does and with components/envs/textworld_speedups.py.

``python -m bench.game_generation`` (also part of ``make bench``; needs no pipeline run)
writes bench/results/game_generation.json. The cpu profile's hardest games (treasure
hunter 14-20, quests 4-6, where generate_tasks spends its time) are made, compiled and
verified as the stage does, each game once as TextWorld makes it (``sorted`` by its own
``Proposition.__lt__``, states holding plain sets) and once with
``components.envs.textworld_speedups.py`` (the key; fact sets that remember their order),
in alternation so that a host's drift hits both alike; every pair must give the same game.
Reported: seconds per step (make, compile, verify) for each sort, the ratios, and the
CPU seconds of the whole build.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import bench_parser, cpu_name

RESULTS = Path("bench/results/game_generation.json")
# (family, difficulty, seed): the top of the cpu profile's range, where the making is slow
GAMES = [("treasure", d, s) for d, s in ((20, 1), (19, 2), (18, 3), (16, 4), (14, 5))] + [
    ("quest", d, s) for d, s in ((6, 6), (5, 7), (4, 8))
]


def build_once(family: str, difficulty: int, seed: int, fast: bool, folder: Path) -> dict:
    """Make, compile and verify one game; seconds per step and what it made."""
    from textworld import logic

    from components.envs import textworld_games as games
    from components.envs import textworld_speedups as speedups
    from components.envs.textworld_games import _compile, _make_game, verify_walkthrough

    speedups.use_keyed_fact_sort()  # once: later calls (the stage's own) change nothing
    logic.sorted = speedups.keyed_sorted(logic.Proposition) if fast else builtins.sorted
    init = logic.State.__init__  # use_keyed_fact_sort's, wrapping TextWorld's own
    logic.State.__init__ = init if fast else init.__wrapped__
    # the stage's _compile opens ni_without_index; the plain build gets a no-op instead
    games.ni_without_index = speedups.ni_without_index if fast else contextlib.nullcontext
    try:
        start = time.process_time()
        t0 = time.perf_counter()
        game = _make_game(family, difficulty, seed)
        t1 = time.perf_counter()
        path = folder / "game.z8"
        _compile(game, path)
        t2 = time.perf_counter()
        won = verify_walkthrough(path, game.walkthrough)
        t3 = time.perf_counter()
    finally:
        logic.State.__init__ = init
    return {
        "make": t1 - t0,
        "compile": t2 - t1,
        "verify": t3 - t2,
        "cpu": time.process_time() - start,  # this process only: the compilers come on top
        "game": json.dumps(game.serialize(), sort_keys=True),
        "z8": path.read_bytes(),
        "won": won,
    }


def main() -> dict[str, Any]:
    """Build every game both ways and write the JSON."""
    from textworld import logic

    from components.envs import textworld_games as games
    from components.envs import textworld_speedups as speedups

    speedups.use_keyed_fact_sort()  # before the first build, so the plain runs stay plain
    modes = {"plain": False, "fast": True}
    steps = ("make", "compile", "verify", "cpu")
    times: dict[str, dict[str, list[float]]] = {m: {s: [] for s in steps} for m in modes}
    wall = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, spec in enumerate(GAMES):
                built = {}
                order = list(modes) if i % 2 == 0 else list(modes)[::-1]
                for mode in order:
                    folder = Path(tmp) / f"{i}-{mode}"
                    folder.mkdir()
                    built[mode] = build_once(*spec, modes[mode], folder)
                    for s in steps:
                        times[mode][s].append(built[mode][s])
                for key in ("game", "z8", "won"):
                    if built["plain"][key] != built["fast"][key]:
                        raise AssertionError(f"{spec}: the speedups changed the game's {key}")
    finally:
        logic.sorted = speedups.keyed_sorted(logic.Proposition)
        games.ni_without_index = speedups.ni_without_index
    totals = {m: {s: round(sum(v), 2) for s, v in times[m].items()} for m in modes}
    out = {
        "cpu": cpu_name(),
        "games": ["-".join(map(str, g)) for g in GAMES],
        "identical_games": True,  # checked pair by pair above
        "seconds": totals,
        "median_make_seconds": {m: round(statistics.median(times[m]["make"]), 3) for m in times},
        **{
            f"{s}_speedup": round(totals["plain"][s] / totals["fast"][s], 2)
            for s in ("make", "compile", "verify")
        },
        "build_speedup": round(
            sum(totals["plain"][s] for s in steps[:3]) / sum(totals["fast"][s] for s in steps[:3]),
            2,
        ),
        "python_cpu_speedup": round(totals["plain"]["cpu"] / totals["fast"]["cpu"], 2),
        "wall_seconds": round(time.perf_counter() - wall, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {k: out[k] for k in ("seconds", "make_speedup", "compile_speedup", "build_speedup")}
        )
    )
    return out


if __name__ == "__main__":
    bench_parser("bench.game_generation", __doc__).parse_args()
    main()
