"""ScienceWorld's state edits: what pick up / put down / move / pour / (de)activate do to
the ``Here:`` and ``Inventory:`` text.

TextWorld's edits (grounded_state.py) read ``a X, a Y`` lists and ``On the floor:``;
ScienceWorld lists a room as ``a; b (containing c, d); e. On the e is: f, g`` and the
inventory as items joined by spaces, each in the env's order (by name, doors last). An
item is found by the words of the command's reference (``flower pot 6 containing apple
tree and soil in inventory``): its name ends with the reference's last word or holds all
its words, the most shared words win, then the most shared words of what it contains.
The grounded model's fit (grounded_fit.py) picks per verb the edit that reproduces the
most real transitions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import lru_cache

_ARTICLE = re.compile(r"^(?:an?|the|some)\s+", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+")
_CONTINUATION = ("which ", "currently ", "that ")  # a fragment that describes the item before
_SURFACE = re.compile(r"\. (?:On|In) the [^.;()]*? (?:is|you see): ")
_CONTAINING = " (containing "
_HERE = "Here: "
_NOTHING = "nothing"
_INV_SPLIT = re.compile(r" (?=(?:an?|the|some) )", re.IGNORECASE)
# an article after one of these words is inside a description ("a picture of a meadow")
_INSIDE = frozenset({"of", "with", "in", "on", "at", "to", "as", "by", "from", "and", "called",
                     "containing", "crossing", "is", "is:", "see:"})  # fmt: skip
_DOOR = "a door to "

TAKE, PUT_DOWN, MOVE, POUR, ACTIVATE, DEACTIVATE = (
    "sci_take", "sci_put_down", "sci_move", "sci_pour", "sci_activate", "sci_deactivate",
)  # fmt: skip
SCIENCE_EDIT_OPERATORS = (TAKE, PUT_DOWN, MOVE, POUR, ACTIVATE, DEACTIVATE)
_SWITCH = {  # (off, on) phrases of a device
    ACTIVATE: ((", which is turned off", ", which is turned on"),
               (", which is deactivated", ", which is activated"),
               (", which is off", ", which is on")),
}  # fmt: skip
_SWITCH[DEACTIVATE] = tuple((on, off) for off, on in _SWITCH[ACTIVATE])

Path = tuple[int, ...]


# -- the listing as a tree of items ----------------------------------------------------


def _split_depth0(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _items(text: str, sep: str) -> list[str]:
    """The items of a listing (``nothing`` has none); ``a bulb, which is off`` stays one."""
    if text.strip() in ("", _NOTHING):
        return []
    if sep == " ":  # the inventory: an item starts at an article not inside a description
        out: list[str] = []
        for part in _INV_SPLIT.split(text.strip()):
            last = out[-1].rsplit(" ", 1)[-1].lower() if out else ""
            if out and (last in _INSIDE or out[-1].count("(") > out[-1].count(")")):
                out[-1] = f"{out[-1]} {part}"
            elif part:
                out.append(part)
        return out
    out = []
    for part in _split_depth0(text, sep):
        if out and sep == ", " and part.startswith(_CONTINUATION):
            out[-1] = f"{out[-1]}, {part}"
        elif part:
            out.append(part)
    return out


def _join(items: list[str], sep: str) -> str:
    return sep.join(items) if items else _NOTHING


def _children(item: str) -> tuple[str, str, str] | None:
    """(text before, the item's own listing, text after) or None when it lists nothing."""
    depth = 0
    for i, c in enumerate(item):
        if c == "(":
            if depth == 0 and item.startswith(_CONTAINING, i - 1):
                close, d = len(item), 0
                for j in range(i, len(item)):
                    d += {"(": 1, ")": -1}.get(item[j], 0)
                    if d == 0:
                        close = j
                        break
                start = i + len("(containing ")
                return item[:start], item[start:close], item[close:]
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and c == "." and (m := _SURFACE.match(item, i)):
            return item[: m.end()], item[m.end() :], ""
    return None


def _walk(text: str, sep: str, path: Path = ()) -> Iterator[tuple[Path, str]]:
    for i, item in enumerate(_items(text, sep)):
        yield (*path, i), item
        if (sub := _children(item)) is not None:
            yield from _walk(sub[1], ", ", (*path, i))


def _edit_at(text: str, sep: str, path: Path, fn: Callable[[list[str], int], list[str]]) -> str:
    """``text`` with ``fn(items, index)`` applied to the listing that holds ``path``."""
    items = _items(text, sep)
    if len(path) == 1:
        return _join(fn(items, path[0]), sep)
    before, inner, after = _children(items[path[0]]) or ("", "", "")
    items[path[0]] = before + _edit_at(inner, ", ", path[1:], fn) + after
    return _join(items, sep)


def _replace(text: str, sep: str, path: Path, new: str) -> str:
    """``text`` with the item at ``path`` replaced by ``new``."""
    return _edit_at(text, sep, path, lambda items, i: [*items[:i], new, *items[i + 1 :]])


def _item_at(text: str, sep: str, path: Path) -> str:
    return dict(_walk(text, sep))[path]


# -- finding what a command names ------------------------------------------------------


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _name(item: str) -> str:
    return _ARTICLE.sub("", re.split(r" \(|, |\. ", item, maxsplit=1)[0]).lower()


def reference(text: str) -> tuple[list[str], set[str], bool]:
    """(name words, content words, in the inventory) of a command's object reference."""
    text = text.lower().strip()
    carried = text.endswith(" in inventory")
    if carried:
        text = text[: -len(" in inventory")]
    name, _, contents = text.partition(" containing ")
    name = name.split(" in ", 1)[0]
    return _WORD.findall(name), _words(contents.split(" in ", 1)[0]), carried


def find(text: str, sep: str, ref: str) -> Path | None:
    """The path of the listed item ``ref`` names best, or None if it names none."""
    words, contents, _ = reference(ref)
    if not words:
        return None
    names = set(words)
    best, best_path = None, None
    for path, item in _walk(text, sep):
        head = _WORD.findall(_name(item))
        # the noun ("battery cathode" is not the battery), or every word ("egg turtle")
        if not head or (head[-1] != words[-1] and not names <= set(head)):
            continue
        score = (len(names & set(head)), len(contents & _words(item)), -len(set(head) - names))
        if best is None or score > best:
            best, best_path = score, path
    return best_path


def _carried(item: str) -> str:
    """An item as a container or the inventory lists it: each of its sentences closed
    (``a closet. The closet door is closed.``); a room's listing drops the full stops."""
    base = item.rstrip(".")
    return base + "." * (len(_split_depth0(base, ". ")) - 1)


def _sort_key(item: str) -> str:
    return _ARTICLE.sub("", item).lower()


def _insert_sorted(items: list[str], item: str) -> list[str]:
    """``items`` with ``item`` before the first later name (doors stay last)."""
    key = _sort_key(item)
    for i, other in enumerate(items):
        if other.lower().startswith(_DOOR) or _sort_key(other) > key:
            return [*items[:i], item, *items[i:]]
    return [*items, item]


# -- the edits --------------------------------------------------------------------------


def _remove(text: str, sep: str, path: Path) -> str:
    return _edit_at(text, sep, path, lambda items, i: items[:i] + items[i + 1 :])


def _put_into(text: str, sep: str, path: Path, item: str) -> str | None:
    """``item`` listed inside the container at ``path`` (None if it lists nothing)."""
    holder = _item_at(text, sep, path)
    sub = _children(holder)
    if sub is None:
        return None
    before, inner, after = sub
    placed = before + _join(_insert_sorted(_items(inner, ", "), _carried(item)), ", ") + after
    return _replace(text, sep, path, placed)


def _split_y(y: str) -> str:
    """The container a pour / move names: ``art studio in jug`` -> ``jug``."""
    parts = [p for p in y.split(" in ") if p and p != "inventory"]
    return parts[-1] if parts else y


def science_edit(op: str, here: str, inventory: str, x: str, y: str) -> tuple[str, str]:
    """(the ``Here:`` line, inventory) after ScienceWorld edit ``op``; unchanged if it
    names nothing in view."""
    room = here[len(_HERE) :] if here.startswith(_HERE) else here
    inv = inventory
    if op == TAKE:  # out of the room (or out of the container named) into the inventory
        if (path := _in_room(room, x, y)) is not None:
            item = _item_at(room, "; ", path)
            room = _remove(room, "; ", path)
            inv = _join(_insert_sorted(_items(inv, " "), _carried(item)), " ")
    elif op == PUT_DOWN:  # out of the inventory onto the room's listing
        if (path := find(inv, " ", x)) is not None and len(path) == 1:
            item = _item_at(inv, " ", path)
            inv = _remove(inv, " ", path)
            room = _join(_insert_sorted(_items(room, "; "), item.rstrip(".")), "; ")
    elif op in (MOVE, POUR):
        room, inv = _move(op, room, inv, x, _split_y(y))
    elif op in _SWITCH and (path := find(room, "; ", x)) is not None:
        item = _item_at(room, "; ", path)
        for old, new in _SWITCH[op]:
            if old in item:
                room = _replace(room, "; ", path, item.replace(old, new, 1))
                break
    return _HERE + room, inv


def _in_room(room: str, x: str, y: str) -> Path | None:
    """The path of the room's item ``x`` names, inside the item ``y`` names if it holds one."""
    holder = find(room, "; ", _split_y(y)) if y else None
    inner = find_in(room, holder, x) if holder is not None else None
    return inner if inner is not None else find(room, "; ", x)


def listed(here: str, inventory: str, x: str, y: str = "") -> str | None:
    """The listed item (room first, then inventory) that reference ``x`` names, or None."""
    room = here[len(_HERE) :] if here.startswith(_HERE) else here
    if not reference(x)[2] and (path := _in_room(room, x, y)) is not None:
        return _item_at(room, "; ", path)
    path = find(inventory, " ", x)
    return None if path is None else _item_at(inventory, " ", path)


@lru_cache(maxsize=1 << 14)
def display_name(item: str) -> str:
    """What ``focus on`` calls a listed item: ``a substance called water`` -> ``water``,
    ``a apple tree in the adult stage, soil`` -> ``apple tree``."""
    name = _name(item).removeprefix("substance called ")
    return re.sub(r" in the \w+ stage\b.*$", "", name)


def base_name(item: str) -> str:
    """What ``pick up`` / ``move`` call it: an animal without its life stage
    (``a baby beaver`` -> ``beaver``, ``a turtle egg`` -> ``turtle``)."""
    return display_name(item).removeprefix("baby ").removesuffix(" egg")


_BASE_NAMED = frozenset({"pick", "move", "put"})  # verbs whose feedback says "the beaver"


def science_names(here: str, inventory: str, verb: str, x: str, y: str) -> tuple[str, str]:
    """The names ScienceWorld's feedback uses for a command's objects: ``cup`` -> ``glass
    cup``, ``flower pot 6 containing ... in inventory`` -> ``flower pot 6`` (the reference
    itself where it names nothing listed)."""
    name = base_name if verb in _BASE_NAMED else display_name
    item = listed(here, inventory, x, y) if x else None
    box = listed(here, inventory, _split_y(y)) if y else None
    return (name(item) if item else x), (display_name(box) if box else y)


_PART = r"(anode|cathode|terminal \d+)"
_TERMINAL = re.compile(rf"^(?:{_PART} in (.+)|(.+?) {_PART})$")


def _terminal(ref: str) -> str | None:
    """``battery anode`` / ``anode in battery`` -> ``anode on battery``."""
    m = _TERMINAL.match(ref.strip().lower())
    if m is None:
        return None
    part, thing = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
    return f"{part} on {thing}"


@lru_cache(maxsize=1 << 14)
def science_feedback(command: str, location: str, here: str, inventory: str) -> str | None:
    """ScienceWorld's fixed answer to a valid command where one is known, else None:
    ``inventory`` lists it, ``put down X`` names the room, ``connect`` names both ends."""
    text = " ".join(command.lower().split())
    if text == "inventory":
        return f"In your inventory, you see: {inventory}"
    if text.startswith("put down ") and (path := find(inventory, " ", text[9:])) is not None:
        return f"You move the {base_name(_item_at(inventory, ' ', path))} to the {location}."
    if text.startswith("connect ") and " to " in text:
        a, b = (_terminal(p) for p in text[8:].split(" to ", 1))
        if a and b:
            return f"{a} is now connected to {b}"
    return None


@lru_cache(maxsize=1 << 14)
def look_answer(command: str, here: str, inventory: str) -> tuple[str, str] | None:
    """(why, feedback) of ``look at X`` (X as a container lists it: 309 of 504 real looks
    at a listed thing read exactly that) or ``look in X``; None if X names nothing listed."""
    text = command.strip()
    inside = text.lower().startswith("look in ")
    if not (inside or text.lower().startswith("look at ")):
        return None
    x, _, y = text[len("look at ") :].partition(" in ")
    if (item := listed(here, inventory, x, y)) is None:
        return None
    name = _name(item)
    if not inside:
        return f"Looking at the {name} reads what the room lists of it.", _carried(item)
    if re.search(r"\bis closed\b", item):
        return f"The {name} is closed.", f"The {name} isn't open, so you can't see inside."
    if (sub := _children(item)) is None:
        return None
    return f"Looking in the {name} reads what it holds.", f"Inside the {name} is: {sub[1]}"


def find_in(room: str, holder: Path, ref: str) -> Path | None:
    """The path of the item ``ref`` names inside the item at ``holder``."""
    sub = _children(_item_at(room, "; ", holder))
    if sub is None:
        return None
    inner = find(sub[1], ", ", ref)
    return None if inner is None else (*holder, *inner)


def _move(op: str, room: str, inv: str, x: str, y: str) -> tuple[str, str]:
    """``move X to Y`` puts the item into Y; ``pour X in Y`` puts X's contents there."""
    carried = reference(x)[2] or find(room, "; ", x) is None
    source, sep = (inv, " ") if carried else (room, "; ")
    path = find(source, sep, x)
    if path is None:
        return room, inv
    item = _item_at(source, sep, path)
    moved = [item]
    if op == POUR and (sub := _children(item)) is not None:
        moved = _items(sub[1], ", ")  # the contents go, the container stays
        left = _replace(source, sep, path, sub[0] + _NOTHING + sub[2])
    else:
        left = _remove(source, sep, path)
    new_room, new_inv = (room, left) if carried else (left, inv)
    for where, sep in ((new_room, "; "), (new_inv, " ")):  # the container: here, or carried
        if (target := find(where, sep, y)) is None:
            continue
        for thing in moved:
            if (placed := _put_into(where, sep, target, thing)) is None:
                return room, inv
            where = placed
        return (where, new_inv) if sep == "; " else (new_room, where)
    return room, inv
