"""What the cpu experience model knows of a game's rooms, and the command lists it answers.

``RoomKnowledge`` is a part of ``GroundedModel`` (components/experience/grounded.py): it
reads the model's fitted tables (exits walked, rooms' recorded views, recorded states and
their admissible commands) to answer where a ``go`` leads when no recorded episode took
it (a room with the matching unexplored exit back; on ScienceWorld the room the command
names, borrowed from the task family's game where this game's data never entered it; on
TextWorld, failing those, a dreamt room: the goal's room or a dead end, ``_dream_map``),
and which commands a predicted next state lists: recorded ones, else composed by
TextWorld's grammar (grounded_commands.py), else those of the most similar recorded state
of the room (a fallback). Everything derived is cached in the model's ``_cache``, so
every episode dreams the same map.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from components.experience.grounded_commands import CommandRoles, state_commands
from components.experience.grounded_page import page_commands
from components.experience.grounded_science import next_gold
from components.experience.grounded_state import (
    _NEUTRAL,
    _content,
    _world_key,
    exits_of,
    split_cached,
)
from components.memory import OPPOSITE, words

# a goal-only treasure hunt ("Lift the tv from the floor of the playroom."): the room and
# the thing the dream may place where no real episode went
_FLOOR_GOAL = re.compile(r"\bthe ([\w' -]+?) from the floor of the ([\w' -]+?)\s*\.?\s*$", re.I)


class RoomKnowledge:
    """Rooms, exits and command lists from the fitted tables (a part of GroundedModel)."""

    # the GroundedModel fields (and cache) these methods read
    settings: Any
    science: bool
    pages: bool
    exits: dict[tuple[str, str, str], Counter]
    room_views: dict[tuple[str, str], Counter]
    states_by_room: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]]
    admissible_by_state: dict[tuple[str, str], tuple[str, ...]]
    gold_path: dict[str, tuple[str, ...]]
    guessed: dict[tuple[str, str, str], str | None]
    _cache: Any

    def _game_of(self, task: Any) -> str:
        """The game whose recorded world ``task`` plays in: a TextWorld variant's parent."""
        # under its own id a variant had no map, so most treasure variants were unwinnable;
        # a page variant's page is in its state already
        if task.generated and task.parent_task_id and not self.pages:
            return task.parent_task_id
        return task.task_id

    def _guess_room(self, task_id: str, location: str, direction: str) -> str | None:
        """A room of this game whose exit back (the opposite way) leads nowhere known yet.

        Offline logs rarely walk every exit; a room that has the matching unexplored exit
        is the most plausible destination (cached, so every episode dreams the same map).
        """
        if direction not in OPPOSITE or not self.settings.replay:
            return None
        key = (task_id, location, direction)
        if key not in self.guessed:
            back = OPPOSITE[direction]
            known = {r for (t, _, _), dests in self.exits.items() if t == task_id for r in dests}
            candidates = []
            for (tid, room), views in self.room_views.items():
                if tid != task_id or room == location:
                    continue
                view = views.most_common(1)[0][0]
                dest = self.exits.get((tid, room, back))
                if back in exits_of(view) and (not dest or location in dest):
                    candidates.append((room not in known, sum(views.values()), room))
            self.guessed[key] = max(candidates)[2] if candidates else None
        return self.guessed[key]

    def _dreamt_room(self, task: Any, location: str, direction: str) -> tuple[str, str] | None:
        """(room, view) behind an exit of a TextWorld game no real episode took, dreamt.

        Offline logs of a goal-only treasure hunt often never reach its room: a dream that
        answers "You can't go that way" there teaches the policy that unexplored exits are
        walls. So one unexplored exit of the game leads to the room the instruction names,
        with the thing on its floor, and every other one (that no recorded room's
        unexplored exit back fits, ``_guess_room``) to a dead end named after another
        game's room. The way back leads where the episode came from.
        """
        return self._dream_map(task).get((location, direction))

    def _dream_map(self, task: Any) -> dict[tuple[str, str], tuple[str, str]]:
        """{(room, direction): (dreamt room, its view)} of ``task``'s game, and the ways
        back; a function of the fitted tables and the task alone (cached), so every episode,
        batched or alone, dreams the same map."""
        tid, game = task.task_id, self._game_of(task)
        cached = self._cache.dreamt.get(tid)  # per task: the goal room follows its instruction
        if cached is not None:
            return cached
        out: dict[tuple[str, str], tuple[str, str]] = {}
        self._cache.dreamt[tid] = out
        if self.science or self.pages or not self.settings.replay:
            return out
        rooms = sorted(r for (t, r) in self.room_views if t == game)
        unexplored = [
            (room, d)
            for room in rooms
            for d in exits_of(_top_view(self.room_views[(game, room)]))
            if not self.exits.get((game, room, d))
        ]
        if not unexplored:
            return out
        said = (task.instruction or "").lower()
        known = {r.lower() for r in rooms}
        match = _FLOOR_GOAL.search(task.instruction or "")
        if match and match.group(2).lower() not in known:
            exit_ = min(unexplored, key=lambda e: zlib.crc32(f"{tid}|{e}".encode()))
            thing = match.group(1)
            article = "an" if thing[:1].lower() in "aeiou" else "a"
            goal = self._canonical_room(match.group(2))
            out[exit_] = (goal, f"Exits: {OPPOSITE[exit_[1]]}. On the floor: {article} {thing}.")
        # dead ends: never a room of this game, nor one the instruction names (an empty
        # room of that name would teach that the named room holds nothing)
        names = [
            n
            for n in self._room_names()
            if n.lower() not in known and not re.search(rf"\b{re.escape(n.lower())}\b", said)
        ]
        names.sort(key=lambda n: zlib.crc32(f"{tid}|{n}".encode()))
        for room, d in unexplored:
            if (room, d) in out or self._guess_room(game, room, d) is not None:
                continue
            if not names:
                break
            out[(room, d)] = (names.pop(), f"Exits: {OPPOSITE[d]}.")
        for (room, d), (dreamt, _) in list(out.items()):
            out[(dreamt, OPPOSITE[d])] = (room, _top_view(self.room_views[(game, room)]))
        return out

    def _goal_exit(self, task: Any) -> tuple[str, str, str] | None:
        """(room, direction, goal room): where ``task``'s dream has its goal room, if any."""
        goal = _FLOOR_GOAL.search(task.instruction or "")
        for (room, d), (dreamt, view) in self._dream_map(task).items():
            if goal and dreamt.lower() == goal.group(2).lower() and "On the floor" in view:
                return room, d, dreamt
        return None

    def _room_names(self) -> list[str]:
        """Every room name real data showed, in any game (sorted; cached)."""
        if self._cache.room_names is None:
            self._cache.room_names = sorted({r for (_, r) in self.room_views})
        return self._cache.room_names

    def _canonical_room(self, name: str) -> str:
        """``name`` spelt as real data spells it in some game ("dish-pit" -> "Dish-Pit")."""
        for known in self._room_names():
            if known.lower() == name.lower():
                return known
        return "-".join(part[:1].upper() + part[1:] for part in name.split("-"))

    def _admissible(
        self,
        task_id: str,
        next_state: str,
        current: Sequence[str],
        played: Sequence[str] | None = None,
    ) -> tuple[tuple[str, ...], bool]:
        """The next state's commands (and whether they are a fallback's); with ``played``
        (the episode's commands in order), also the expert's next one."""
        adm, fallback = self._listed(task_id, next_state, current)
        nxt = next_gold(self.gold_path.get(task_id, ()), played or ())
        if nxt is None or nxt in adm:
            return adm, fallback
        # as the ScienceWorld env lists it: the expert's next command, whatever is in view
        # (every expert command in view let a dreamt mix come before its pours)
        return (nxt, *adm), fallback

    def _listed(
        self, task_id: str, next_state: str, current: Sequence[str]
    ) -> tuple[tuple[str, ...], bool]:
        key = (task_id, _world_key(next_state))
        recorded = self.admissible_by_state.get(key)
        if recorded:
            return recorded, False
        known = self._cache.admissible.get(key)
        if known is not None:
            return known
        composed = state_commands(next_state, self._roles())
        if composed is not None:  # a TextWorld compact state: its commands, composed
            self._cache.remember_admissible(key, (composed, False))
            return composed, False
        if self.pages:  # a page no list was recorded for: this one's commands on it
            return page_commands(next_state, current), False
        location, surroundings, inventory = split_cached(next_state)
        candidates = self._room_candidates(task_id, location)
        if not candidates:
            return tuple(current), True
        present = frozenset(words(surroundings + " " + inventory))
        best = max(candidates, key=lambda c: len(c[0] & present))
        # the nearest recorded state may show objects this one lacks: drop their commands
        kept = tuple(a for a in best[1] if _content(a) <= present | _NEUTRAL)
        out = (kept or best[1], True)
        self._cache.remember_admissible(key, out)
        return out

    def _roles(self) -> CommandRoles:
        """Keys and food, learned from every recorded admissible command (cached)."""
        if self._cache.roles is None:
            self._cache.roles = CommandRoles.learn(
                c for adm in self.admissible_by_state.values() for c in adm
            )
        return self._cache.roles

    def _named_room(self, task_id: str, where: str, rooms: dict[str, str] | None) -> str | None:
        """The room of this game that ``go``'s object names, if real data or this episode
        showed it."""
        name = where.removeprefix("to ").strip()
        known = self._views(task_id, name) or name in (rooms or {})
        return name if name and known else None

    def _views(self, task_id: str, room: str) -> Counter:
        """This game's recorded views of ``room``; on ScienceWorld, where its data never
        entered the room, those of the task family's game that did most often (every
        game shares one house: the doors match, the objects are another game's)."""
        own = self.room_views.get((task_id, room))
        if own or not self.science:
            return own or Counter()
        donor = self._donor(task_id, room)
        return self.room_views[(donor, room)] if donor else Counter()

    def _donor(self, task_id: str, room: str) -> str | None:
        """The game of ``task_id``'s family (then any game) whose data shows ``room`` most
        (cached: every episode borrows the same room)."""
        key = (task_id, room)
        if key not in self._cache.donors:
            family = _family(task_id)
            seen = [
                (_family(t) == family, sum(views.values()), t)
                for (t, r), views in self.room_views.items()
                if r == room and t != task_id and views
            ]
            self._cache.donors[key] = max(seen)[2] if seen else None
        return self._cache.donors[key]

    def _room_candidates(
        self, task_id: str, location: str
    ) -> list[tuple[frozenset[str], tuple[str, ...]]]:
        """(words, admissible commands) of the recorded states of a room, first seen first."""
        key = (task_id, location)
        out = self._cache.rooms.get(key)
        if out is None:
            seen: set[tuple[str, tuple[str, ...]]] = set()
            out = []
            recorded = self.states_by_room.get(key)
            if not recorded and self.science and (donor := self._donor(task_id, location)):
                recorded = self.states_by_room.get((donor, location))  # a borrowed room
            for state_key, adm in recorded or ():
                if (state_key, adm) not in seen:  # a repeat never wins max() over the first
                    seen.add((state_key, adm))
                    out.append((frozenset(words(state_key)), adm))
            self._cache.rooms[key] = out
        return out


def _top_view(views: Counter) -> str:
    return views.most_common(1)[0][0]


def _family(task_id: str) -> str:
    """``sw-find-plant-0152-40fc8ed3`` -> ``sw-find-plant`` (the game's task family)."""
    return task_id.rsplit("-", 2)[0]
