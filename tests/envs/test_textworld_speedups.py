"""TextWorld's facts sorted by key and ni run without its index: the same games and play."""

from __future__ import annotations

import builtins
import copy
import json
import pickle
import random

import pytest

pytest.importorskip("textworld")

from textworld import logic

from components.envs.textworld_games import _compile, _make_game
from components.envs.textworld_speedups import (
    NO_INDEX,
    FactSet,
    keyed_sorted,
    ni_without_index,
    use_keyed_fact_sort,
)


def _random_propositions(rng: random.Random, n: int) -> list[logic.Proposition]:
    # few names and types: many ties on the name, some on a variable's name alone
    names, types = ["at", "in", "on", "not_at"], ["P", "r", "o", "k", "c"]
    props = set()
    while len(props) < n:
        args = [
            logic.Variable(rng.choice("abcd") + rng.choice(["", "_1"]), rng.choice(types))
            for _ in range(rng.randint(0, 3))
        ]
        props.add(logic.Proposition(rng.choice(names), args))
    return list(props)


def test_the_keyed_sort_orders_propositions_as_their_own_comparisons_do():
    rng = random.Random(0)
    fast = keyed_sorted(logic.Proposition)
    for _ in range(200):
        props = _random_propositions(rng, rng.randint(2, 30))
        rng.shuffle(props)
        assert fast(props) == builtins.sorted(props)
        assert fast(iter(props), reverse=True) == builtins.sorted(props, reverse=True)


def test_other_lists_and_calls_with_a_key_go_to_the_builtin_sort():
    fast = keyed_sorted(logic.Proposition)
    variables = [logic.Variable("b", "o"), logic.Variable("a", "r"), logic.Variable("a", "o")]
    assert fast(variables) == builtins.sorted(variables)
    assert fast([3, 1, 2], key=lambda x: -x) == [3, 2, 1]
    assert fast([]) == []
    with pytest.raises(TypeError):  # mixed types still fail as the builtin does
        fast([logic.Proposition("at", []), 1])


def test_a_fact_set_sorts_as_its_members_do_after_every_change():
    rng = random.Random(1)
    fast = keyed_sorted(logic.Proposition)
    pool = _random_propositions(rng, 40)
    facts = FactSet(pool[:10])
    changes = [
        lambda s: s.add(rng.choice(pool)),
        lambda s: s.discard(rng.choice(pool)),
        lambda s: s.remove(next(iter(s))) if s else None,
        lambda s: s.pop() if s else None,
        lambda s: s.update(rng.sample(pool, 3)),
        lambda s: s.difference_update(rng.sample(pool, 5)),
        lambda s: s.intersection_update(rng.sample(pool, 30)),
        lambda s: s.symmetric_difference_update(rng.sample(pool, 4)),
        lambda s: s.__ior__(set(rng.sample(pool, 2))),
        lambda s: s.__isub__(set(rng.sample(pool, 2))),
        lambda s: s.__iand__(set(rng.sample(pool, 35))),
        lambda s: s.__ixor__(set(rng.sample(pool, 2))),
        lambda s: s.clear() if rng.random() < 0.05 else None,
    ]
    for _ in range(300):
        assert fast(facts) == builtins.sorted(facts)  # remembered or sorted anew
        rng.choice(changes)(facts)
    first = fast(facts)
    first.append("the caller's list")  # sorted's result is the caller's to change
    assert fast(facts) == builtins.sorted(facts)


def test_a_fact_set_copy_keeps_the_order_and_changes_apart():
    facts = FactSet(_random_propositions(random.Random(2), 12))
    fast = keyed_sorted(logic.Proposition)
    fast(facts)
    twin = facts.copy()
    assert type(twin) is FactSet and twin == facts and twin.order == facts.order
    extra = logic.Proposition("zz", [])
    twin.add(extra)
    assert extra not in facts and fast(facts) == builtins.sorted(facts)
    assert fast(twin) == builtins.sorted(twin)
    # pickled to a worker or deep-copied: the same members, sorted as they are, and changes
    # still forget the order
    for other in (pickle.loads(pickle.dumps(twin)), copy.deepcopy(twin)):
        assert type(other) is FactSet and other == twin
        assert fast(other) == builtins.sorted(other) == builtins.sorted(twin)
        other.discard(extra)
        assert fast(other) == builtins.sorted(other) == builtins.sorted(facts)


def test_states_keep_their_facts_in_fact_sets_once_installed():
    use_keyed_fact_sort()
    from textworld.logic import GameLogic, State

    state = State(GameLogic(), [logic.Proposition("at", [logic.Variable("a", "P")])])
    prop = logic.Proposition("in", [logic.Variable("b", "o")])
    state.add_fact(prop)
    assert all(type(s) is FactSet for s in state._facts.values())
    assert all(type(s) is FactSet for s in state.copy()._facts.values())
    assert state.is_fact(prop) and len(list(state.facts)) == 2


def _play(game_file: str, walkthrough: list[str]) -> list[tuple]:
    import textworld

    infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, facts=True)
    env = textworld.start(game_file, request_infos=infos)
    try:
        state = env.reset()
        seen = []
        for command in [*walkthrough, None]:
            seen.append(
                (
                    tuple(state["admissible_commands"]),
                    tuple(state["policy_commands"]),
                    tuple(map(str, state["facts"])),
                )
            )
            if command is not None:
                state, _, _ = env.step(command)
        return seen
    finally:
        env.close()


@pytest.mark.parametrize(("family", "difficulty", "seed"), [("treasure", 14, 5), ("quest", 4, 9)])
def test_games_made_and_played_with_the_keyed_sort_are_the_same(
    family, difficulty, seed, tmp_path, monkeypatch
):
    use_keyed_fact_sort()  # installed first, so that the plain run below really is plain
    made, played = {}, {}
    for mode, sorter in (("plain", builtins.sorted), ("keyed", keyed_sorted(logic.Proposition))):
        monkeypatch.setattr(logic, "sorted", sorter)
        game = _make_game(family, difficulty, seed)
        made[mode] = json.dumps(game.serialize(), sort_keys=True)
        path = tmp_path / mode / "game.z8"
        _compile(game, path)
        played[mode] = _play(str(path), list(game.walkthrough))
    assert made["keyed"] == made["plain"]
    assert played["keyed"] == played["plain"]
    assert (tmp_path / "keyed" / "game.z8").read_bytes() == (
        tmp_path / "plain" / "game.z8"
    ).read_bytes()


def test_ni_runs_without_its_index_only_while_asked_and_writes_the_same_story_file(
    tmp_path, monkeypatch
):
    import subprocess

    import textworld
    from textworld.generator import compile_game
    from textworld.generator.inform7 import world2inform7

    commands = []
    real = subprocess.check_output

    def spy(cmd, *args, **kwargs):
        commands.append([str(c) for c in cmd])
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "check_output", spy)
    game = _make_game("quest", 3, 4)
    for name in ("plain", "noindex"):
        options = textworld.GameOptions()
        options.path = str(tmp_path / name / "game.z8")
        options.force_recompile = True
        if name == "plain":
            compile_game(game, options)
        else:
            with ni_without_index():
                compile_game(game, options)
    assert world2inform7.subprocess is subprocess  # put back
    ni = [c for c in commands if c[0].endswith("/ni")]
    assert len(ni) == 2 and NO_INDEX not in ni[0] and ni[1][-1] == NO_INDEX
    i6 = [c for c in commands if c[0].endswith("/inform6")]
    assert len(i6) == 2 and NO_INDEX not in i6[1]  # only ni is told
    assert (tmp_path / "noindex" / "game.z8").read_bytes() == (
        tmp_path / "plain" / "game.z8"
    ).read_bytes()
