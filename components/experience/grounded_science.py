"""ScienceWorld's win conditions as features of the grounded model's won/lost classifiers.

A ScienceWorld task names what to focus on ("focus on the green paint", "focus on the
thing"), often where to move it ("move it to the blue box") or a device to power. A win
is a focus on the right object, a move of the focused object into the named box, or the
connect that closes a circuit; a focus on anything else loses. ``science_features``
measures those relations against the episode so far, and ``WordPrior`` adds what real
data says of the command's words under its verb (which animal lives longest is not in
the instruction: it is in which ``focus on`` won). The prior of a training row counts
only the other games (out of fold): a game's own outcome must not leak into its feature.

A linear classifier still wins where real data never went: RL found that ``wait1`` right
after the focus "powers" the bulb, and that a move into the box wins with no focus at
all. ``WinGate`` learns, per kind of task, the verbs that won and the relations that held
in *every* real win (the bulb's four connects, the focus before the move), and the model
grants a win only where they hold.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from components.experience.grounded_science_edits import look_answer
from components.memory import OPPOSITE, EpisodeMemory, command_content, content_words

_FOCUS = re.compile(r"focus on (?:the )?([^.]+)", re.IGNORECASE)
_BOX = re.compile(r"\b(\w+) box\b")
SCIENCE_FEATURES = 24  # len(science_features(...))
_MAX_CONNECTS = 6


def is_science(instructions: Iterable[str]) -> bool:
    """Every instruction names something to focus on (ScienceWorld's task grammar)."""
    seen = False
    for text in instructions:
        if not _FOCUS.search(text or ""):
            return False
        seen = True
    return seen


@dataclass
class WordPrior:
    """Wins and losses per (verb, content word) of real transitions, also per task kind
    (the instruction's first sentence: "find a(n) plant"), per game for out-of-fold."""

    counts: Counter = field(default_factory=Counter)
    by_game: dict[str, Counter] = field(default_factory=dict)

    def add(self, game: str, instruction: str, command: str, won: bool, lost: bool) -> None:
        """Count one real command of ``game``."""
        own = self.by_game.setdefault(game, Counter())
        for key in _keys(instruction, command):
            for outcome, hit in (("n", True), ("won", won), ("lost", lost)):
                own[(outcome, key)] += hit
                self.counts[(outcome, key)] += hit

    def score(self, instruction: str, command: str, leave_out: str | None = None) -> list[float]:
        """The smoothed win and loss rates of the command's words, alone and under this
        kind of task (the highest per word; without ``leave_out``'s counts)."""
        own = self.by_game.get(leave_out) if leave_out else None
        best = [0.0] * 4
        for key in _keys(instruction, command):
            n = self.counts[("n", key)] - (own[("n", key)] if own else 0)
            for i, outcome in enumerate(("won", "lost")):
                hits = self.counts[(outcome, key)] - (own[(outcome, key)] if own else 0)
                j = 2 * i + (len(key) == 3)
                best[j] = max(best[j], (hits + 0.1) / (n + 2.0))
        return best

    def frozen(self) -> WordPrior:
        """The same counts without the per-game split (what prediction needs)."""
        return WordPrior(Counter(self.counts))


@lru_cache(maxsize=1 << 14)
def _kind(instruction: str) -> str:
    first = instruction.split(".", 1)[0]
    return " ".join(sorted(content_words(first)))


def _keys(instruction: str, command: str) -> list[tuple[str, ...]]:
    verb = command.split(" ", 1)[0].lower()
    kind = _kind(instruction)
    words = command_content(command)
    return [*((verb, w) for w in words), *((kind, verb, w) for w in words)]


@dataclass(frozen=True)
class WinGate:
    """Per kind of task and winning verb: the win conditions (of ``win_conditions``) that
    held in every real win of that kind by that verb; kinds with fewer wins are not gated.
    Per verb, so that a kind's rare focus-win does not excuse its move-wins from moving the
    thing focused on."""

    verbs: dict[str, frozenset[str]]
    conditions: dict[tuple[str, str], frozenset[str]]
    min_wins: int = 3

    @classmethod
    def fit(cls, wins: Iterable[tuple[str, str, frozenset[str]]], min_wins: int = 3) -> WinGate:
        """From (instruction, command, its win conditions) of every real winning step."""
        held: dict[tuple[str, str], frozenset[str]] = {}
        count: Counter = Counter()
        for instruction, command, conditions in wins:
            key = (_kind(instruction), _verb(command))
            count[key[0]] += 1
            held[key] = held[key] & conditions if key in held else conditions
        kinds = {k for k in count if count[k] >= min_wins}
        verbs: dict[str, set[str]] = {}
        for kind, verb in held:
            if kind in kinds:
                verbs.setdefault(kind, set()).add(verb)
        return cls(
            {k: frozenset(v) for k, v in verbs.items()},
            {key: c for key, c in held.items() if key[0] in kinds},
            min_wins,
        )

    def allows(self, instruction: str, command: str, conditions: frozenset[str]) -> bool:
        """Whether a win is possible here: a verb that won this kind, its conditions held."""
        gate = self.gate_of(_kind(instruction))
        if gate is None:
            return True
        needed = gate.get(_verb(command))
        return needed is not None and needed <= conditions

    def gate_of(self, kind: str) -> dict[str, frozenset[str]] | None:
        """{winning verb: the conditions it needs} of ``kind``; an unseen kind ("turn on
        the blue light bulb") takes the kinds sharing most of its words (any verb of them,
        the conditions all of them need); None where none shares two words."""
        if kind in self.verbs:
            return {v: self.conditions[(kind, v)] for v in self.verbs[kind]}
        words = set(kind.split())
        overlap = {k: len(words & set(k.split())) for k in self.verbs}
        best = max(overlap.values(), default=0)
        if best < 2:
            return None
        near = [k for k, n in overlap.items() if n == best]
        return {
            v: frozenset.intersection(
                *(self.conditions[(k, v)] for k in near if v in self.verbs[k])
            )
            for v in frozenset().union(*(self.verbs[k] for k in near))
        }


def _thing(reference: str) -> frozenset[str]:
    """The content words of the thing a command names, without where it is ("egg parrot
    egg in inventory" -> egg, parrot): a real win moved it out of the inventory."""
    return command_content(reference.split(" in ", 1)[0])


# words any living thing's name may hold (its life stage, its kind): "focus on blue jay"
# then "move egg blue jay egg in inventory" wins, as does "move living thing in inventory",
# but an adult pea plant is not the adult apple tree
_GENERIC = frozenset(
    {"egg", "living", "thing", "adult", "baby", "young", "juvenile", "seed", "seedling",
     "plant", "tree"}
)  # fmt: skip


def _same_thing(moved: frozenset[str], focused: Sequence[frozenset[str]]) -> bool:
    """Whether the moved thing may be one focused on: a shared specific word, or a generic
    name on either side (174 of 176 real find-* wins share a word, the rest are generic)."""
    specific = moved - _GENERIC
    return not specific or any(not (f - _GENERIC) or specific & f for f in focused)


def win_conditions(mem: EpisodeMemory, state: str, command: str) -> frozenset[str]:
    """The relations of ``command`` to the task and the episode so far a win may need."""
    verb = _verb(command)
    cw = command_content(command)
    focused = [c for c in mem.used if c.startswith("focus on ")]
    focus_words = frozenset().union(*(_thing(c) for c in focused))
    moved = _thing(command.split(" to ", 1)[0])
    boxes = set(_BOX.findall(mem.instruction.lower()))
    connects = sum(n for c, n in mem.used.items() if c.startswith("connect "))
    out = {f"connects>={k}" for k in range(1, _MAX_CONNECTS + 1) if connects >= k}
    out |= {f"used {_verb(c)}" for c in mem.used}  # the paint was mixed, a door opened ...
    match = _FOCUS.search(mem.instruction)
    target = content_words(match.group(1)) if match else frozenset()
    if target and cw and cw <= target:
        out.add("names the focus target")  # the green paint, not the blue one
    if target and target <= focus_words:
        out.add("focused on the target before")  # the bulb to power
    if focused:
        out.add("focused before")
    # a second focus never won a find task for real (the first wrong one ends it there)
    if sum(mem.used[c] for c in focused) + (verb == "focus") == 1:
        out.add("one focus")
    if verb == "focus" or focused:
        out.add("focus")
    if verb == "move" and moved and _same_thing(moved, [_thing(c) for c in focused]):
        out.add("moves the focused thing")
    if any(f"to {b} box" in command.lower() for b in boxes):
        out.add("to the named box")
    if any(f"{b} box" in state.lower() for b in boxes):
        out.add("the box is here")
    if cw and cw <= content_words(state):
        out.add("named in the state")
    return frozenset(out)


def focus_as_move(mem: EpisodeMemory, state: str, command: str) -> tuple[EpisodeMemory, str] | None:
    """A find task's ``focus on X`` with X already in the named box, as the move it mirrors:
    (the memory after this focus, ``move X to <colour> box``). ScienceWorld takes the two in
    either order (5 of 16 replayed dreamt losses won so), real data only focus-then-move."""
    verb, x, _, _ = science_parse(command)
    thing = _thing(command) if verb == "focus" else frozenset()
    if not thing:
        return None
    for colour in _BOX.findall(mem.instruction.lower()):
        held = re.search(rf"\b{colour} box \(containing ([^)]*)\)", state, re.IGNORECASE)
        if held and thing <= content_words(held.group(1)):
            after = mem.copy()
            after.update(command, state)
            return after, f"move {x} to {colour} box"
    return None


_POLES = ("anode", "cathode")
_UNPLUG = frozenset({"disconnect", "pick", "move", "put", "take"})


def _terminal(reference: str) -> tuple[str, str]:
    """(device, terminal) a connect names: "cathode in red light bulb", "battery anode",
    "black wire terminal 1" -> (red light bulb, cathode), (battery, anode), (black wire, 1)."""
    ref = reference.strip().lower()
    part, sep, device = ref.partition(" in ")
    if sep:
        return device.strip(), part.strip()
    head, _, last = ref.rpartition(" ")
    if last in _POLES:
        return head, last
    head2, _, word = head.rpartition(" ")
    return (head2, last) if word == "terminal" else (ref, "")


def circuit_closed(mem: EpisodeMemory) -> bool:
    """Whether the episode's connects close a circuit from the battery through the task's
    focused target: battery anode -> wires -> its cathode, its anode -> wires -> battery
    cathode (every real power-component win). ScienceWorld lights the bulb on the world's
    next tick: the connect that closes it wins in 11 of 20 demonstrations, the step after
    it (``wait1``, or whatever comes next) in the others."""
    match = _FOCUS.search(mem.instruction)
    target = match.group(1).strip().lower() if match else ""
    used = {c.lower() for c in mem.used}
    # another focus moves ScienceWorld's focus off the bulb; a picked-up wire is
    # disconnected, and the memory's command counts cannot tell what came after it
    if not target or {c for c in used if c.startswith("focus on ")} != {f"focus on {target}"}:
        return False
    if any(_verb(c) in _UNPLUG for c in used):
        return False
    links: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for command in used:
        verb, x, prep, y = science_parse(command)
        if verb != "connect" or prep != "to":
            continue
        a, b = _terminal(x), _terminal(y)
        links.setdefault(a, set()).add(b)
        links.setdefault(b, set()).add(a)

    def reaches(start: tuple[str, str], goal: tuple[str, str]) -> bool:
        seen, todo = {start}, [start]
        while todo:
            device, pin = todo.pop()
            nxt = set(links.get((device, pin), ()))
            if "wire" in device.split():  # a wire conducts end to end
                nxt |= {(device, t) for t in ("1", "2") if t != pin}
            for n in nxt - seen:
                if n == goal:
                    return True
                seen.add(n)
                todo.append(n)
        return False

    return reaches(("battery", "anode"), (target, "cathode")) and reaches(
        ("battery", "cathode"), (target, "anode")
    )


# parts a command names that a state's text does not list (a battery's anode, a wire's
# terminals), and look around: in view wherever their device or room is
PARTS = frozenset({"anode", "cathode", "terminal", "1", "2", "around"})
_PARTICLES = ("on ", "at ", "in ", "up ", "to ", "down ")
_SCIENCE_PREPS = (" to ", " on ", " in ", " into ")


@lru_cache(maxsize=1 << 14)
def science_parse(command: str) -> tuple[str, str, str, str]:
    """(verb, object, preposition, second object) of a ScienceWorld command: the verb's
    particle dropped ("focus on X" -> X, "pick up X" -> X), "move / connect X to Y" split."""
    verb, _, rest = command.strip().partition(" ")
    rest = rest.strip()
    for particle in _PARTICLES:
        if rest.startswith(particle):
            rest = rest[len(particle) :]
            break
    for prep in _SCIENCE_PREPS:
        if prep in rest:
            x, y = rest.split(prep, 1)
            return verb.lower(), x.strip(), prep.strip(), y.strip()
    return verb.lower(), rest, "", ""


def door_shut(surroundings: str, room: str) -> str | None:
    """ScienceWorld's answer to ``go to <room>`` when the way is not open (None if it is):
    a closed door to it, or no door to it from here."""
    match = re.search(rf"door to the {re.escape(room)} \(that is (open|closed)\)", surroundings)
    if match is None:
        return "It's not clear how to get there from here."
    return None if match.group(1) == "open" else "The door is not open."


def mix_refused(text: str, container: str) -> str | None:
    """ScienceWorld's answer to ``mix <container>`` when it holds fewer than two things
    (None if it holds two or more, or the state does not show it)."""
    noun = container.split(" containing", 1)[0].strip()
    held = re.findall(rf"\b{re.escape(noun)} \(containing ([^)]*)\)", text)
    if not noun or not held or any(len(h.split(", ")) >= 2 for h in held):
        return None
    if held[0].strip() == "nothing":
        return "That container is empty, so there are no items to mix."
    return f"There is only one thing ({held[0].strip()})"


_UNKNOWN = "No known action matches that input."


def science_rule(
    verb: str, x: str, y: str, location: str, surroundings: str, inventory: str, command: str = ""
) -> tuple[str, str, str] | None:
    """(why, feedback, surroundings after) where ScienceWorld's answer is fixed, else None:
    ``look around`` names this room, ``go`` only through an open door of this room, ``mix``
    only two things or more, and ``open / close door to <room>`` flips that door (1,273 of
    1,273 real opens of a closed door did) or, with no such door here, is no known action.
    Real data holds almost no refused mix, so the learned feedback always mixed; a learned
    edit never touched "(that is closed)"."""
    if verb == "look" and x == "around":  # the env's own words (a template named a room)
        return "Looking changes nothing.", f"You look around the {location}.", surroundings
    if verb == "go" and x in OPPOSITE:  # 162 of 162 real compass moves
        return "ScienceWorld goes to rooms by name.", _UNKNOWN, surroundings
    if verb == "look" and (answer := look_answer(command, surroundings, inventory)) is not None:
        return (*answer, surroundings)
    named = x.removesuffix(" door")  # "open kitchen door" is the door to the kitchen
    if verb in ("open", "close") and not y and named != x and f"to the {named} (" in surroundings:
        x, y = "door", named
    if verb == "go" and (shut := door_shut(surroundings, x)) is not None:
        return f"The way to the {x} is not open from here.", shut, surroundings
    if verb == "mix" and (alone := mix_refused(surroundings + " " + inventory, x)) is not None:
        return f"The {x} does not hold two things to mix.", alone, surroundings
    if verb in ("open", "close") and x == "door" and y:
        door = re.compile(rf"(door to the {re.escape(y)} \(that is )(open|closed)\)")
        match = door.search(surroundings)
        if match is None:  # no such door in view (the env still lists the expert's next)
            return f"No door to the {y} here.", _UNKNOWN, surroundings
        want = "open" if verb == "open" else "closed"
        if match.group(2) == want:
            return (
                f"The door to the {y} is {want} already.",
                f"The door is already {want}.",
                surroundings,
            )
        after = door.sub(rf"\g<1>{want})", surroundings, count=1)
        return f"The door to the {y} was {match.group(2)}.", f"The door is now {want}.", after
    return None


def next_gold(gold: Sequence[str], played: Sequence[str]) -> str | None:
    """The expert's next command after the commands ``played`` (in order), as the real
    env's pointer moves: past ``gold[i]`` only when ``gold[i]`` is played while it is next,
    so a gold command played early ("pick up X" before "focus on X") does not count."""
    pos = 0
    for command in played:
        if pos < len(gold) and _norm(command) == _norm(gold[pos]):
            pos += 1
    return gold[pos] if pos < len(gold) else None


def unlisted_gold(admissible: Sequence[str], nxt: str | None, cap: int) -> tuple[str, ...]:
    """A recorded command list without the recording episode's next gold command ``nxt``
    where the list is full (``cap`` commands): the env put it first, ahead of the commands
    the cap cut, so another episode, its pointer elsewhere, would not see it listed."""
    if nxt is None or len(admissible) < cap:
        return tuple(admissible)
    return tuple(a for a in admissible if _norm(a) != _norm(nxt))


def _norm(command: str) -> str:
    return " ".join(command.lower().split())


def door_open_behind(surroundings: str, came_from: str) -> str:
    """The room walked into, its door back to ``came_from`` open: a door is shared by the two
    rooms, and real data's first sight of this room may have it closed."""
    pattern = rf"(door to the {re.escape(came_from)} \(that is )closed\)"
    return re.sub(pattern, r"\1open)", surroundings)


def _verb(command: str) -> str:
    return command.split(" ", 1)[0].lower()


def science_features(
    mem: EpisodeMemory, state: str, command: str, prior: Sequence[float]
) -> list[float]:
    """How ``command`` relates to the task's focus target, its box and the episode so far."""
    verb = command.split(" ", 1)[0].lower()
    cw = command_content(command)
    match = _FOCUS.search(mem.instruction)
    target = content_words(match.group(1)) if match else frozenset()
    focused = [c for c in mem.used if c.startswith("focus on ")]
    focus_words = frozenset().union(*(_thing(c) for c in focused))
    is_focus, is_move = float(verb == "focus"), float(verb == "move")
    named = len(cw & target) / len(cw) if cw and target else 0.0
    moved = _thing(command.split(" to ", 1)[0])  # a move's object, not its box
    same = len(moved & focus_words) / len(moved) if moved and focus_words else 0.0
    boxes = set(_BOX.findall(mem.instruction.lower()))
    to_box = float(any(f"to {b} box" in command.lower() for b in boxes))
    box_here = float(any(f"{b} box" in state.lower() for b in boxes))  # a move needs it near
    in_state = float(bool(cw) and cw <= content_words(state))
    connects = min(sum(n for c, n in mem.used.items() if c.startswith("connect ")), _MAX_CONNECTS)
    is_connect = float(verb == "connect")
    return [
        is_focus,
        is_focus * named,
        float(bool(focused)),
        is_focus * float(bool(focused)),
        is_move,
        same,
        to_box,
        is_move * same * to_box,
        is_move * same * to_box * box_here,
        float(same == 1.0) * is_move * to_box * box_here,
        is_focus * in_state,
        is_focus * named * in_state,
        is_connect,
        connects / _MAX_CONNECTS,
        is_connect * connects / _MAX_CONNECTS,
        *prior,
        *(is_focus * p for p in prior),
        is_move * to_box * prior[1],
    ]
