"""What the cpu experience model knows of a game's rooms, and the command lists it answers.

``RoomKnowledge`` is a part of ``GroundedModel`` (components/experience/grounded.py): it
reads the model's fitted tables (exits walked, rooms' recorded views, recorded states and
their admissible commands) to answer where a ``go`` leads when no recorded episode took
it (a room with the matching unexplored exit back; on ScienceWorld the room the command
names, borrowed from the task family's game where this game's data never entered it),
and which commands a predicted next state lists: recorded ones, else composed by
TextWorld's grammar (grounded_commands.py), else those of the most similar recorded state
of the room (a fallback). Everything derived is cached in the model's ``_cache``, so
every episode dreams the same map.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from components.experience.grounded_commands import CommandRoles, state_commands
from components.experience.grounded_science import next_gold
from components.experience.grounded_state import (
    _NEUTRAL,
    _content,
    _world_key,
    exits_of,
    split_cached,
)
from components.memory import OPPOSITE, words


class RoomKnowledge:
    """Rooms, exits and command lists from the fitted tables (a part of GroundedModel)."""

    # the GroundedModel fields (and cache) these methods read
    settings: Any
    science: bool
    exits: dict[tuple[str, str, str], Counter]
    room_views: dict[tuple[str, str], Counter]
    states_by_room: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]]
    admissible_by_state: dict[tuple[str, str], tuple[str, ...]]
    gold_path: dict[str, tuple[str, ...]]
    guessed: dict[tuple[str, str, str], str | None]
    _cache: Any

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


def _family(task_id: str) -> str:
    """``sw-find-plant-0152-40fc8ed3`` -> ``sw-find-plant`` (the game's task family)."""
    return task_id.rsplit("-", 2)[0]
