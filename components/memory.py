"""What an agent (or a world model) remembers of a text-game episode, and word helpers.

Shared by the scoring policy's features (components/agent/features.py) and the grounded
experience model (components/experience/grounded.py), so both read instructions and
abstract states the same way. Nothing here is privileged: an ``EpisodeMemory`` is built
only from the task's instruction and the episode's own (action, resulting state) record.

* the instruction is cut into step sentences (those naming a verb or a direction); an
  instruction pointer advances when an executed command that changed the world completes
  the next step sentence or the one after it (all its object/direction words appear
  there, a lock's key aside, and a word for its verb or it is a move): a greeting that
  names a verb ("Get ready to pick stuff up ...") is skipped, never waited on; a thing
  the sentence names only inside a longer name ("keycard" in "the type K keycard") is a
  namesake, not the thing, and completes nothing;
* rooms visited, (room, command) pairs tried and where each exit led are counted; an
  exit taken also tells the way back (the opposite exit of the room reached, where that
  room lists one: TextWorld's maps are grids), and each room's listed exits are kept, so
  the rooms with an exit never taken (the frontier) and how far each room is from one
  are known.
"""

from __future__ import annotations

import re
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from functools import lru_cache

_WORD = re.compile(r"[a-z0-9]+")
_TOKEN = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")  # words and punctuation (a name's boundaries)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_STOPWORDS = "the a an from on in into with to of and then that is it this you your be if can "
_STOPWORDS += "please i need me at inside within onto up for will so by as are its there"
STOPWORDS = frozenset(_STOPWORDS.split())
DIRECTIONS = ("north", "south", "east", "west")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
VERBS = ("go", "take", "drop", "put", "insert", "open", "close", "unlock", "lock", "examine")
VERBS += ("look", "inventory", "eat")
# Instruction words meaning a command verb: frozen static embeddings do not know that
# "retrieve" means "take"; this small lexicon does (an LM policy would know it). The verbs
# of TextWorld's instruction grammar (house_instruction.twg: "ditch/toss the X on the floor",
# "sit the X on the Y", "deposit the X into the Y") are all in it.
VERB_WORDS: dict[str, frozenset[str]] = {
    "go": frozenset(("go", "venture", "head", "travel", "trip", "walk", "move", "attempt"))
    | {"try", "make"},
    "take": frozenset(("take", "retrieve", "recover", "lift", "pick", "grab", "get", "fetch"))
    | {"obtain", "find"},
    "put": frozenset(("put", "place", "set", "rest", "stick", "lay", "sit")),
    "insert": frozenset(("insert", "put", "place", "stick", "set", "deposit")),
    "open": frozenset(("open", "ajar")),
    "close": frozenset(("close", "shut", "closed")),
    "unlock": frozenset(("unlock", "unlocked")),
    "lock": frozenset(("lock", "locked")),
    "drop": frozenset(("drop", "discard", "down", "ditch", "throw", "toss", "deposit", "place")),
    "eat": frozenset(("eat", "consume")),
}
# TextWorld's commands name things between these words: "take X from Y", "unlock X with K"
_PREPOSITIONS = frozenset(("from", "into", "on", "in", "with"))
_NO_OBJECTS = frozenset(("go", "look", "inventory"))
_STEP_WORDS = frozenset(DIRECTIONS).union(*VERB_WORDS.values())
_EXIT_DIRECTION = re.compile(r"\b(north|south|east|west)\b")
NO_FRONTIER = 5  # frontier distances are capped here (and "no frontier known" reads so)


def words(text: str) -> list[str]:
    """Lower-case word tokens."""
    return _WORD.findall(text.lower())


@lru_cache(maxsize=65536)
def content_words(text: str) -> frozenset[str]:
    """Words that name things (stopwords removed); cached: the same texts recur every step."""
    return frozenset(w for w in words(text) if w not in STOPWORDS)


@lru_cache(maxsize=65536)
def verb_of(command: str) -> str:
    """The command's verb, or ``other``."""
    first = command.split(" ", 1)[0].lower()
    return first if first in VERBS else "other"


@lru_cache(maxsize=65536)
def command_content(command: str) -> frozenset[str]:
    """The command's object and direction words (its verb dropped)."""
    ws = words(command)
    return frozenset(w for w in ws[1:] if w not in STOPWORDS)


@lru_cache(maxsize=65536)
def object_phrases(command: str) -> tuple[tuple[str, ...], ...]:
    """The names of the things a text-game command acts on, as token tuples.

    ``take type K keycard from locker`` -> ``(("type", "k", "keycard"), ("locker",))``;
    a command whose verb is not a text-game verb names nothing here.
    """
    ws = command.lower().split()
    if not ws or ws[0] in _NO_OBJECTS or ws[0] not in VERBS:
        return ()
    phrases, current = [], []
    for w in ws[1:]:
        if w in _PREPOSITIONS and current:
            phrases.append(current)
            current = []
        else:
            current.append(w)
    phrases.append(current)
    return tuple(t for t in (tuple(_TOKEN.findall(" ".join(p))) for p in phrases) if t)


EXACT, NAMESAKE, ABSENT = 2, 1, 0


@lru_cache(maxsize=65536)
def naming(phrase: tuple[str, ...], text: str) -> int:
    """How ``text`` names ``phrase``: EXACT, only as part of a longer name (NAMESAKE), or ABSENT.

    A name is bounded by stopwords or punctuation: "the type K keycard." names
    ``type k keycard`` exactly and ``keycard`` only as a namesake.
    """
    tokens = _TOKEN.findall(text.lower())
    n, found = len(phrase), ABSENT
    for i in range(len(tokens) - n + 1):
        if tuple(tokens[i : i + n]) != phrase:
            continue
        before = tokens[i - 1] if i else "."
        after = tokens[i + n] if i + n < len(tokens) else "."
        if all(t in STOPWORDS or t == "s" or not t.isalnum() for t in (before, after)):
            return EXACT
        found = NAMESAKE
    return found


def instruction_steps(instruction: str) -> list[str]:
    """The instruction's sentences that can name a step (a verb or direction word in them)."""
    steps = [s for s in _SENTENCE.split(instruction.strip()) if content_words(s) & _STEP_WORDS]
    return steps or [instruction]


def overlap(command: str, sentence_words: Set[str]) -> float:
    """Share of the command's content words that the sentence contains."""
    cw = command_content(command)
    return len(cw & sentence_words) / len(cw) if cw else 0.0


def verb_in(command: str, sentence_words: Set[str]) -> float:
    """1 if the sentence uses a word for the command's verb."""
    lexicon = VERB_WORDS.get(verb_of(command))
    return float(bool(lexicon and lexicon & sentence_words))


@lru_cache(maxsize=65536)
def split_state(state: str) -> tuple[str, str, str]:
    """(location, surroundings, inventory) of a ``Key: value`` abstract state."""
    location, inventory, rest = "", "", []
    for line in state.splitlines():
        if line.startswith("Location: "):
            location = line[len("Location: ") :]
        elif line.startswith("Inventory: "):
            inventory = line[len("Inventory: ") :]
        elif not line.startswith("Feedback: "):
            rest.append(line)
    return location, " ".join(rest), inventory


@lru_cache(maxsize=65536)
def listed_exits(surroundings: str) -> frozenset[str] | None:
    """The directions an ``Exits: ...`` sentence lists (None: the state lists none)."""
    start = surroundings.find("Exits: ")
    if start < 0:
        return None
    end = surroundings.find(".", start)
    return frozenset(_EXIT_DIRECTION.findall(surroundings[start : end if end > 0 else None]))


def completes(command: str, sentence_words: Set[str], sentence: str = "") -> bool:
    """Whether ``command`` does what the step sentence asks (its objects, and its verb or a move).

    The key of a ``lock``/``unlock`` need not be named: "unlock the locker" is the step.
    A thing the sentence names only inside a longer name is another thing.
    """
    if command.startswith(("lock ", "unlock ")):
        command = command.split(" with ", 1)[0]
    if overlap(command, sentence_words) < 0.99:
        return False
    if sentence and any(naming(p, sentence) == NAMESAKE for p in object_phrases(command)):
        return False
    return bool(verb_in(command, sentence_words)) or command.startswith("go ")


@dataclass
class EpisodeMemory:
    """The agent's memory of its episode so far (see the module docstring)."""

    instruction: str
    steps: list[str] = field(default_factory=list)
    step_words: list[frozenset[str]] = field(default_factory=list)
    pointer: int = 0  # instruction sentences done
    visits: dict[str, int] = field(default_factory=dict)
    tried: dict[tuple[str, str], int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)  # the commands played, in order
    exits: dict[tuple[str, str], str] = field(default_factory=dict)  # (room, dir) -> room
    room_exits: dict[str, frozenset[str]] = field(default_factory=dict)  # listed directions
    # room -> exits to the nearest frontier, computed when first asked
    _frontier: dict[str, int] | None = field(default=None, repr=False, compare=False)
    last_action: str = ""
    last_direction: str = ""
    last_changed: bool = True
    n_steps: int = 0
    location: str = ""
    surroundings: str = ""
    inventory: str = ""

    @classmethod
    def replay(
        cls, instruction: str, initial_state: str, history: Sequence[tuple[str, str]] = ()
    ) -> EpisodeMemory:
        """The memory after ``history`` ((action, resulting state) pairs) from the start."""
        steps = instruction_steps(instruction)
        mem = cls(instruction, steps, [content_words(s) for s in steps])
        mem._see(initial_state)
        for action, result in history:
            mem.update(action, result)
        return mem

    def copy(self) -> EpisodeMemory:
        """An independent copy (to branch an episode)."""
        return EpisodeMemory(
            **{
                k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                for k, v in self.__dict__.items()
            }
        )

    def _see(self, state: str) -> None:
        self.location, self.surroundings, self.inventory = split_state(state)
        self.visits[self.location] = self.visits.get(self.location, 0) + 1
        listed = listed_exits(self.surroundings)
        if listed is not None:
            self.room_exits[self.location] = listed
        self._frontier = None

    def update(self, action: str, result: str) -> None:
        """Remember that ``action`` led to the state ``result``."""
        before = (self.location, self.surroundings, self.inventory)
        self.tried[(self.location, action)] = self.tried.get((self.location, action), 0) + 1
        self.used[action] = self.used.get(action, 0) + 1
        self.history.append(action)
        self._see(result)
        self.last_changed = (self.location, self.surroundings, self.inventory) != before
        if action.startswith("go "):
            direction = action[3:]
            if self.location != before[0]:
                self.exits[(before[0], direction)] = self.location
                back = OPPOSITE.get(direction, "")
                if back in self.room_exits.get(self.location, ()):
                    self.exits.setdefault((self.location, back), before[0])
            self.last_direction = direction
        if self.last_changed:
            # the next sentence may be the one done: a sentence no command completes (a
            # greeting naming a verb, "Get ready to pick stuff up ...") must not stall it
            for j in range(self.pointer, min(self.pointer + 2, len(self.steps))):
                if completes(action, self.step_words[j], self.steps[j]):
                    self.pointer = j + 1
                    break
        self.last_action = action
        self.n_steps += 1

    def frontier_distance(self, room: str) -> int:
        """Exits from ``room`` to the nearest room with a listed exit never taken (capped)."""
        if self._frontier is None:
            self._frontier = self._frontier_distances()
        return self._frontier.get(room, NO_FRONTIER)

    def _frontier_distances(self) -> dict[str, int]:
        # breadth-first from every frontier room, backwards along the known exits
        into: dict[str, list[str]] = {}
        for (room, _), dest in self.exits.items():
            into.setdefault(dest, []).append(room)
        dist = {
            room: 0
            for room, listed in self.room_exits.items()
            if any(
                (room, d) not in self.exits and not self.tried.get((room, f"go {d}"))
                for d in listed
            )
        }
        todo = list(dist)
        for room in todo:  # grows as it goes: a queue
            if dist[room] + 1 >= NO_FRONTIER:
                continue
            for prev in into.get(room, ()):
                if prev not in dist:
                    dist[prev] = dist[room] + 1
                    todo.append(prev)
        return dist

    @property
    def current_step(self) -> str:
        """The instruction sentence the agent works on (the whole task when done)."""
        return self.steps[self.pointer] if self.pointer < len(self.steps) else self.instruction
