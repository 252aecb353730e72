"""The synthetic-env benchmark's CPU-side parts: profile phases, the action rule, gc clock."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_profile_phase_names_a_function_where_it_lives():
    # a module split that moves a function would silently read its phase as 0% of step time
    from bench.synthetic_env import PHASES

    for label, func, suffix in PHASES:
        homes = [p for p in ROOT.glob("components/**/*.py") if p.as_posix().endswith(suffix)]
        assert len(homes) == 1, (label, suffix, homes)
        assert func in _defined(homes[0]), f"{label}: no {func} in {homes[0]}"


def test_even_episodes_replay_their_script_then_play_admissible_commands():
    from bench.synthetic_env import FALLBACK_ACTION, Actions

    actions = Actions({"t": ["go north", "take key"]}, seed=0)
    admissible = ["look", "inventory"]
    assert [actions.choose("t", 0, s, admissible) for s in range(2)] == ["go north", "take key"]
    assert actions.choose("t", 0, 2, admissible) in admissible  # the script has run out
    assert actions.choose("t", 1, 0, admissible) in admissible  # odd: random from the start
    assert actions.choose("other", 2, 0, admissible) in admissible  # no script for the task
    assert actions.choose("t", 1, 0, []) == FALLBACK_ACTION


def test_the_gc_clock_counts_collections_only_while_entered():
    from bench.synthetic_env import _GcClock

    with _GcClock() as clock:
        gc.collect(0)
        gc.collect(2)
    after = dict(clock.collections)
    gc.collect()
    assert after == {0: 1, 2: 1} and clock.collections == after
    assert clock.seconds >= 0.0 and clock not in gc.callbacks
