"""A compact abstract state rendered from TextWorld's world facts (what the agent can see).

TextWorld's room descriptions are long and padded with flavour text ("A standard one. You
decide to start listing off everything you see..."); the paper's experience model reasons
over abstract states instead. From the game's facts (``at``, ``in``, ``on``, ``open``,
``locked``, exits, food attributes) this renders only what is observable from the current
room, one short sentence per thing, in a fixed order::

    Exits: east, north (closed wooden door).
    The fridge is open and contains a carrot, a raw egg.
    On the counter: a knife, a red onion.
    Nothing is on the stand.

Objects inside closed containers and things in other rooms are never shown (partial
observability is kept). The sentences use the same words as the game's descriptions so
the grounded teacher's state diff reads them unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PLAYER = "P"
INVENTORY = "I"
_DIRECTIONS = ("north", "south", "east", "west")
# food attributes in the order the game writes them ("a diced fried red potato")
_CUT = ("sliced", "chopped", "diced")
_COOK = ("raw", "roasted", "fried", "grilled", "burned")
_CONTAINER_STATES = ("locked", "closed", "open")
_SUPPORTER_TYPES = ("s", "stove", "bbq")
_PORTABLE_TYPES = ("o", "f", "k", "meal")  # objects, food, keys: they lie on the floor


@dataclass
class _World:
    """The facts of one state indexed by predicate."""

    at: dict[str, str] = field(default_factory=dict)  # thing -> room
    inside: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    on: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    flags: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    exits: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    doors: dict[tuple[str, str], str] = field(default_factory=dict)  # (room, dest) -> door
    types: dict[str, str] = field(default_factory=dict)  # thing -> TextWorld type
    player_room: str | None = None


def _index(facts: Iterable[Any]) -> _World:
    world = _World()
    for fact in facts:
        args = [a.name for a in fact.arguments]
        for a in fact.arguments:
            world.types.setdefault(a.name, a.type)
        name = fact.name
        if name == "at" and len(args) == 2:
            if args[0] == PLAYER:
                world.player_room = args[1]
            else:
                world.at[args[0]] = args[1]
        elif name == "in" and len(args) == 2:
            world.inside[args[1]].append(args[0])
        elif name == "on" and len(args) == 2:
            world.on[args[1]].append(args[0])
        elif name.endswith("_of") and name[:-3] in _DIRECTIONS and len(args) == 2:
            # north_of(a, b): a is north of b, so b has an exit to the north
            world.exits[args[1]][name[:-3]] = args[0]
        elif name == "link" and len(args) == 3:
            world.doors[(args[0], args[2])] = args[1]
        elif len(args) == 1:
            world.flags[args[0]].add(name)
    return world


def _thing(world: _World, name: str) -> str:
    """``a diced fried red potato``: the name with its visible food attributes."""
    flags = world.flags.get(name, set())
    adjectives = [a for a in (*_CUT, *_COOK) if a in flags]
    words = " ".join([*adjectives, name])
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _listing(world: _World, names: Iterable[str]) -> str:
    return ", ".join(_thing(world, n) for n in sorted(names))


def _container_state(world: _World, name: str) -> str | None:
    flags = world.flags.get(name, set())
    return next((s for s in _CONTAINER_STATES if s in flags), None)


def _describe(world: _World, name: str) -> str:
    """One sentence about a thing in the room (with what it holds, when visible)."""
    state = _container_state(world, name)
    contents = world.inside.get(name, [])
    if state is not None:
        if state != "open":
            return f"The {name} is {state}."
        if contents:
            return f"The {name} is open and contains {_listing(world, contents)}."
        return f"The {name} is open and empty."
    supported = world.on.get(name, [])
    if supported:
        return f"On the {name}: {_listing(world, supported)}."
    if world.types.get(name) in _SUPPORTER_TYPES:
        return f"Nothing is on the {name}."
    return ""


def _exits(world: _World, room: str) -> str:
    parts = []
    for direction in _DIRECTIONS:
        dest = world.exits.get(room, {}).get(direction)
        if dest is None:
            continue
        door = world.doors.get((room, dest))
        state = _container_state(world, door) if door else None
        parts.append(f"{direction} ({state} {door})" if door and state else direction)
    return f"Exits: {', '.join(parts) if parts else 'none'}."


def compact_description(facts: Iterable[Any]) -> str:
    """The observable part of the world from the player's room, as short sentences."""
    world = _index(facts)
    room = world.player_room
    if room is None:
        return ""
    doors = set(world.doors.values())
    here = sorted(t for t, r in world.at.items() if r == room and t not in doors)
    # supporters/containers first (they explain the rest), loose objects on the floor last
    fixtures, loose = [], []
    for name in here:
        (loose if world.types.get(name) in _PORTABLE_TYPES else fixtures).append(name)
    sentences = [_exits(world, room)]
    for name in fixtures:
        sentence = _describe(world, name)
        sentences.append(sentence or f"There is {_thing(world, name)}.")
    if loose:
        sentences.append(f"On the floor: {_listing(world, loose)}.")
    return " ".join(sentences)


def compact_inventory(facts: Iterable[Any]) -> str:
    """What the player carries (``nothing`` when empty), with food attributes."""
    world = _index(facts)
    carried = world.inside.get(INVENTORY, [])
    return _listing(world, carried) if carried else "nothing"
