"""The admissible commands of a compact TextWorld state, composed from what it shows.

A synthetic episode soon reaches states no real episode recorded (the key taken from the
locker, the locker open). Their commands used to be borrowed from the most similar
recorded state of the room, which lacks exactly the new ones ("lock box with latchkey"
once the latchkey is held), so a dreamed episode could not finish the task its expert
walkthrough finishes. TextWorld's command grammar is small: ``go`` through open exits,
``take``/``drop``/``put``/``insert`` by where things are, ``open``/``close``/``lock``/
``unlock`` by a container's or door's state, ``eat`` food, ``examine`` anything visible.
``state_commands`` composes them from the state (components/envs/textworld_state.py
renders it). Which things are keys or food the state does not say: ``CommandRoles``
learns it from recorded commands (the last word of every ``... with K`` / ``eat F``).
Keys are not matched to locks (the state does not show it), so ``lock``/``unlock`` is
offered with every key held.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from components.experience.grounded_state import exits_of, parse_command
from components.memory import split_state

_NAME = r"[\w'&-]+(?: [\w'&-]+)*?"
_CONTAINER = re.compile(
    rf"The ({_NAME}) is (locked|closed|open and empty|open and contains ([^.]*))\."
)
_SUPPORTER = re.compile(rf"(?:On the ({_NAME}): ([^.]*)|Nothing is on the ({_NAME}))\.")
_FIXTURE = re.compile(rf"There is an? ({_NAME})\.")
_FLOOR = re.compile(r"On the floor: ([^.]*)\.")
_DOOR = re.compile(rf"\b(north|south|east|west) \((locked|closed|open) ({_NAME})\)")
_ARTICLE = re.compile(r"^(a|an|some)\s+")
# food attributes the compact state writes before a name ("a diced fried red potato")
_ATTRIBUTES = frozenset(("sliced", "chopped", "diced", "raw", "roasted", "fried", "grilled"))
_ATTRIBUTES |= {"burned"}


@dataclass(frozen=True)
class CommandRoles:
    """Last words of the things recorded commands use as keys and as food."""

    keys: frozenset[str]
    food: frozenset[str]

    @classmethod
    def learn(cls, commands: Iterable[str]) -> CommandRoles:
        """Roles from recorded commands (admissible lists and actions)."""
        keys, food = set(), set()
        for command in commands:
            verb, x, prep, y = parse_command(command)
            if verb in ("lock", "unlock") and prep == "with" and y:
                keys.add(y.split()[-1].lower())
            elif verb == "eat" and x:
                food.add(x.split()[-1].lower())
        return cls(frozenset(keys), frozenset(food))

    def is_key(self, name: str) -> bool:
        """Whether ``name`` is a key (its last word names one)."""
        return name.split()[-1].lower() in self.keys

    def is_food(self, name: str) -> bool:
        """Whether ``name`` is food (its last word names food)."""
        return name.split()[-1].lower() in self.food


def _items(listing: str) -> list[str]:
    """The names of a listing ("a worm, an old key" -> worm, old key), attributes dropped."""
    out = []
    for item in listing.split(","):
        words = _ARTICLE.sub("", item.strip()).split()
        while len(words) > 1 and words[0] in _ATTRIBUTES:
            words = words[1:]
        if words:
            out.append(" ".join(words))
    return out


def state_commands(state: str, roles: CommandRoles) -> tuple[str, ...] | None:
    """TextWorld's admissible commands of a compact state (sorted); None if unparsable."""
    _, surroundings, inventory = split_state(state)
    if not surroundings.startswith("Exits:"):
        return None
    held = [] if inventory in ("", "nothing") else _items(inventory)
    keys = [k for k in held if roles.is_key(k)]
    out = {"look", "inventory"}
    exits_line = surroundings.split(".", 1)[0]
    doors = {m.group(1): (m.group(2), m.group(3)) for m in _DOOR.finditer(exits_line)}
    for direction in exits_of(surroundings):
        state_, door = doors.get(direction, ("open", None))
        if state_ == "open":
            out.add(f"go {direction}")
        if door:
            out.add(f"examine {door}")
            _openable(out, door, state_, keys)
    rest = surroundings[len(exits_line) + 1 :]
    for m in _CONTAINER.finditer(rest):
        name, status = m.group(1), m.group(2)
        out.add(f"examine {name}")
        _openable(out, name, "open" if status.startswith("open") else status, keys)
        if status.startswith("open"):
            out.update(f"insert {i} into {name}" for i in held)
            out.update(f"take {x} from {name}" for x in _items(m.group(3) or ""))
    for m in _SUPPORTER.finditer(rest):
        name = m.group(1) or m.group(3)
        if name == "floor":
            continue
        out.add(f"examine {name}")
        out.update(f"put {i} on {name}" for i in held)
        out.update(f"take {x} from {name}" for x in _items(m.group(2) or ""))
    out.update(f"examine {m.group(1)}" for m in _FIXTURE.finditer(rest))
    for m in _FLOOR.finditer(rest):
        out.update(f"take {x}" for x in _items(m.group(1)))
    for item in held:
        out.update((f"drop {item}", f"examine {item}"))
        if roles.is_food(item):
            out.add(f"eat {item}")
    for command in list(out):
        verb, x, _, _ = parse_command(command)
        if verb == "take":
            out.add(f"examine {x}")
    return tuple(sorted(out))


def _openable(out: set[str], name: str, status: str, keys: list[str]) -> None:
    """The open/close/lock/unlock commands of a container or door in ``status``."""
    if status == "open":
        out.add(f"close {name}")
    elif status == "closed":
        out.add(f"open {name}")
        out.update(f"lock {name} with {k}" for k in keys)
    elif status == "locked":
        out.update(f"unlock {name} with {k}" for k in keys)
