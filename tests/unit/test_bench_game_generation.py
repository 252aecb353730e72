"""bench/game_generation.py builds a game both ways and gets the same game."""

from __future__ import annotations

import pytest

pytest.importorskip("textworld")


def test_a_game_built_plain_and_fast_is_the_same_game(tmp_path, monkeypatch):
    from textworld import logic

    from bench.game_generation import build_once
    from components.envs import textworld_games, textworld_speedups

    textworld_speedups.use_keyed_fact_sort()
    # build_once rebinds both names; monkeypatch puts them back after the test
    monkeypatch.setattr(logic, "sorted", logic.sorted)
    monkeypatch.setattr(textworld_games, "ni_without_index", textworld_games.ni_without_index)
    built = {}
    for fast in (False, True):
        (tmp_path / str(fast)).mkdir()
        built[fast] = build_once("quest", 2, 3, fast, tmp_path / str(fast))
    for key in ("game", "z8", "won"):
        assert built[True][key] == built[False][key]
    # the plain build ran on TextWorld's own State.__init__; the fast one is back after it
    assert hasattr(logic.State.__init__, "__wrapped__")
    assert built[True]["won"]  # the verified walkthrough wins
    assert all(built[True][s] > 0 for s in ("make", "compile", "verify"))
