"""The compact TextWorld state as the grounded model reads and edits it.

Parsing (commands, exits, listed objects), rendering, feedback templates, the state edit
operators a verb may apply (components/experience/grounded_fit.py learns which;
ScienceWorld's own are in grounded_science_edits.py) and memoised
forms of them for the prediction path.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any

from components.experience.grounded_science_edits import SCIENCE_EDIT_OPERATORS, science_edit
from components.memory import OPPOSITE, command_content, split_state

_WS = re.compile(r"\s+")
_NEUTRAL = frozenset(OPPOSITE)  # words a command may hold without naming a visible object
_PREPS = (" from ", " into ", " on ", " with ", " in ")
UNCHANGED_FEEDBACK = "Nothing happens."


def world_key(state: str) -> str:
    """The state without its feedback line, whitespace-normalised."""
    kept = (ln for ln in state.splitlines() if not ln.startswith("Feedback:"))
    return _WS.sub(" ", " ".join(kept)).strip()


def render_state(location: str, surroundings: str, inventory: str, feedback: str) -> str:
    """The compact abstract state (components/envs/textworld_env.py ``render_state``)."""
    return f"Location: {location}\n{surroundings}\nInventory: {inventory}\nFeedback: {feedback}"


def parse_command(command: str) -> tuple[str, str, str, str]:
    """(verb, object, preposition, second object) of a command."""
    verb, _, rest = command.strip().partition(" ")
    for prep in _PREPS:
        if prep in rest:
            x, y = rest.split(prep, 1)
            return verb.lower(), x.strip(), prep.strip(), y.strip()
    return verb.lower(), rest.strip(), "", ""


def exits_of(surroundings: str) -> list[str]:
    """The directions of the ``Exits: ...`` sentence of a compact state."""
    match = re.search(r"Exits: ([^.]*)\.", surroundings)
    if not match:
        return []
    return [d for d in OPPOSITE if re.search(rf"\b{d}\b", match.group(1))]


def feedback_template(feedback: str, x: str, y: str) -> str:
    """The feedback with the command's objects replaced by ``{X}`` / ``{Y}``."""
    out = feedback
    if y:
        out = re.sub(re.escape(y), "{Y}", out, flags=re.IGNORECASE)
    if x:
        out = re.sub(re.escape(x), "{X}", out, flags=re.IGNORECASE)
    return out


def fill_template(template: str, x: str, y: str) -> str | None:
    """The template with the objects filled in, or None if it needs one the command lacks."""
    if ("{X}" in template and not x) or ("{Y}" in template and not y):
        return None
    return template.replace("{X}", x).replace("{Y}", y)


# -- state edit operators (what a verb does to the compact state) ------------------------


def _article(x: str) -> str:
    return f"{'an' if x[:1].lower() in 'aeiou' else 'a'} {x}"


def _drop_listed(text: str, x: str) -> str:
    """``text`` without the listed item ``a x``; emptied listings take their empty form."""
    out = re.sub(r"(,\s*)?\b(a|an|some)\s+" + re.escape(x) + r"\b", "", text, flags=re.I)
    out = re.sub(r":\s*,\s*", ": ", out)
    out = re.sub(r"On the floor:\s*\.", "", out)
    out = re.sub(r"The ([\w -]+?) is open and contains\s*\.", r"The \1 is open and empty.", out)
    out = re.sub(r"On the ([\w -]+?):\s*\.", r"Nothing is on the \1.", out)
    return _WS.sub(" ", out).strip()


def _add_listed(text: str, x: str, where: str, prep: str) -> str:
    """``text`` with ``a x`` listed on/in ``where`` (the floor when ``where`` is empty)."""
    item = _article(x)
    if not where:
        if "On the floor: " in text:
            return re.sub(r"On the floor: ([^.]*)\.", rf"On the floor: \1, {item}.", text)
        return f"{text} On the floor: {item}.".strip()
    w = re.escape(where)
    if prep in ("on",):
        if re.search(rf"Nothing is on the {w}\.", text):
            return re.sub(rf"Nothing is on the {w}\.", f"On the {where}: {item}.", text)
        return re.sub(rf"On the {w}: ([^.]*)\.", rf"On the {where}: \1, {item}.", text)
    if re.search(rf"The {w} is open and empty\.", text):
        return re.sub(
            rf"The {w} is open and empty\.", f"The {where} is open and contains {item}.", text
        )
    return re.sub(
        rf"The {w} is open and contains ([^.]*)\.",
        rf"The {where} is open and contains \1, {item}.",
        text,
    )


def _set_state(text: str, x: str, old: Sequence[str], new: str) -> str:
    """Container or door ``x`` goes from one of ``old`` states to ``new``."""
    w = re.escape(x)
    out = text
    for o in old:
        if o == "open":
            out = re.sub(
                rf"The {w} is open and (empty|contains [^.]*)\.", f"The {x} is {new}.", out
            )
        else:
            out = re.sub(
                rf"The {w} is {o}\.",
                f"The {x} is {new}." if new != "open" else f"The {x} is open and empty.",
                out,
            )
        out = re.sub(rf"\({o} {w}\)", f"({new} {x})", out)  # a door in the exits line
    return out


def apply_edit(
    op: str, surroundings: str, inventory: str, x: str, prep: str, y: str
) -> tuple[str, str]:
    """(surroundings, inventory) after edit operator ``op``."""
    if op in SCIENCE_EDIT_OPERATORS:
        return science_edit(op, surroundings, inventory, x, y)
    inv_items = [] if inventory in ("", "nothing") else [i.strip() for i in inventory.split(",")]
    if op == "to_inventory":
        inv = [*inv_items, _article(x)] if x else inv_items
        return _drop_listed(surroundings, x), ", ".join(inv) or "nothing"
    if op in ("to_floor", "to_target"):
        kept = [i for i in inv_items if not i.lower().endswith(x.lower())]
        where = y if op == "to_target" else ""
        return _add_listed(surroundings, x, where, prep), ", ".join(kept) or "nothing"
    if op == "consume":
        kept = [i for i in inv_items if not i.lower().endswith(x.lower())]
        return surroundings, ", ".join(kept) or "nothing"
    if op == "open":
        return _set_state(surroundings, x, ("closed",), "open"), inventory
    if op == "close":
        return _set_state(surroundings, x, ("open",), "closed"), inventory
    if op == "unlock":
        return _set_state(surroundings, x, ("locked",), "closed"), inventory
    if op == "lock":
        return _set_state(surroundings, x, ("closed",), "locked"), inventory
    return surroundings, inventory


EDIT_OPERATORS = (
    "none", "to_inventory", "to_floor", "to_target", "consume", "open", "close", "unlock", "lock",
)  # fmt: skip


# -- memoised helpers of the prediction path (pure functions of their arguments) ---------
# An RL run asks about the same few thousand states and commands over and over.

_STATES = 1 << 14
_world_key = lru_cache(maxsize=_STATES)(world_key)
split_cached = lru_cache(maxsize=_STATES)(split_state)
_parse = lru_cache(maxsize=_STATES)(parse_command)
_apply_edit = lru_cache(maxsize=_STATES)(apply_edit)


@lru_cache(maxsize=_STATES)
def _content(command: str) -> frozenset[str]:
    """``command_content`` as a frozenset (shared: never mutate it)."""
    return frozenset(command_content(command))


def _top(counts: Counter) -> Any:
    """The most frequent key, the first counted on ties (``most_common(1)[0][0]``)."""
    return max(counts.items(), key=itemgetter(1))[0]


def listed_objects(state: str) -> Iterator[tuple[str, str]]:
    """(object, where) of each item a compact state lists on the floor, in or on something."""
    room, surroundings, _ = split_state(state)
    for pattern, where in (
        (r"On the floor: ([^.]*)\.", f"the floor of the {room.lower()}"),
        (r"The ([\w -]+?) is open and contains ([^.]*)\.", "the {0}"),
        (r"On the ([\w -]+?): ([^.]*)\.", "the {0}"),
    ):
        for m in re.finditer(pattern, surroundings):
            holder = m.group(1) if m.lastindex and m.lastindex > 1 else ""
            listing = m.group(m.lastindex or 1)
            for item in listing.split(","):
                name = re.sub(r"^(a|an|some)\s+", "", item.strip())
                if name and name != "floor":
                    yield name, where.format(holder)
