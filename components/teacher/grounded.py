"""Grounded teacher: reasoning traces built from the recorded ground truth, no LLM.

Every sentence is derived from the transition itself: admissibility (``valid_action``,
``admissible_actions``), a diff of the compact states (location, inventory, object
states, description, feedback) and the reward/done flags against the goal. It is
deterministic and correct by construction; it is the offline default.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from components.schema import Transition
from components.teacher.base import (
    Annotation,
    AnnotationRequest,
    MalformedAnswerError,
    OnResult,
    excerpt,
    parse_reasoning,
    strip_format_tags,
)

_KEY = re.compile(r"^\s*(location|room|inventory|feedback)\s*:\s*(.*)$", re.IGNORECASE)
_ROOM_HEADER = re.compile(r"^\s*-=\s*(.+?)\s*=-\s*$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_ITEM_SPLIT = re.compile(r"\s*(?:,|;|\band\b)\s*")
_ARTICLE = re.compile(r"^(?:a|an|the|some)\s+", re.IGNORECASE)
_CARRYING = re.compile(r"^you\s+are\s+carrying\s*:?\s*", re.IGNORECASE)
_EMPTY_INVENTORY = {"", "nothing", "none", "empty", "(empty)", "-", "nothing at all"}
_PREPOSITIONS = re.compile(r"\s+(?:in|into|on|onto|from|with|to|under|at)\s+")
_WORD = re.compile(r"[a-z][a-z'-]*")
# Words that describe an object's condition in TextWorld-like games ("an opened fridge",
# "a diced fried red potato", "the oven is empty"). Prepositions such as on/off are left
# out on purpose: they would match "on the table".
STATE_WORDS = (
    "open", "opened", "closed", "locked", "unlocked", "eaten", "sliced", "chopped", "diced",
    "cooked", "roasted", "fried", "grilled", "burned", "raw", "empty", "broken", "lit",
)  # fmt: skip
_STATE_ALT = "|".join(STATE_WORDS)
# fmt: off
_STOPWORDS = frozenset({
    "a", "an", "the", "of", "to", "in", "on", "into", "at", "from", "with", "and", "or",
    "your", "you", "it", "its", "is", "be", "this", "that", "then", "for", "some", "go",
    "take", "put", "get",
})
# fmt: on
_MAX_LISTED = 3
_MAX_QUOTE = 200


@dataclass(frozen=True)
class ParsedState:
    """A compact state split into its parts (absent lines are None / empty)."""

    location: str | None
    description: tuple[str, ...]
    inventory: tuple[str, ...] | None
    feedback: str | None

    def world(self) -> tuple[object, ...]:
        """Everything but the feedback: what an action can change in the world."""
        inv = None if self.inventory is None else tuple(sorted(self.inventory))
        return (self.location, self.description, inv)


def _norm_item(text: str) -> str:
    text = _ARTICLE.sub("", text.strip().strip(".").strip())
    return " ".join(text.lower().split())


def parse_inventory(text: str) -> tuple[str, ...]:
    """Items of an inventory line ('a key, an apple and a pear' -> ('key', 'apple', 'pear'))."""
    text = _CARRYING.sub("", text.strip()).strip().rstrip(".").strip()
    if text.lower() in _EMPTY_INVENTORY or text.lower().startswith("nothing"):
        return ()
    items = [_norm_item(p) for p in _ITEM_SPLIT.split(text)]
    return tuple(i for i in items if i and i not in _EMPTY_INVENTORY)


def _sentences(lines: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for line in lines:
        for s in _SENTENCE.split(" ".join(line.split())):
            if s and s not in out:
                out.append(s)
    return tuple(out)


def parse_state(text: str) -> ParsedState:
    """Parse 'Location: X / description / Inventory: ... / Feedback: ...' (any line optional)."""
    location: str | None = None
    desc: list[str] = []
    inv_lines: list[str] | None = None
    feedback: list[str] | None = None
    section = "description"
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _KEY.match(line)
        if m:
            key, value = m.group(1).lower(), m.group(2).strip()
            if key in ("location", "room"):
                location = value.strip(" .") or None
                section = "description"
            elif key == "inventory":
                inv_lines = [value] if value else []
                # An empty 'Inventory:' is followed by one item per line.
                section = "description" if value else "inventory"
            else:
                feedback = [value] if value else []
                section = "feedback"
            continue
        header = _ROOM_HEADER.match(line)
        if header and location is None:
            location = header.group(1)
            continue
        if section == "inventory" and inv_lines is not None:
            inv_lines.append(line.lstrip("-* "))
        elif section == "feedback" and feedback is not None:
            feedback.append(line)
        else:
            desc.append(line)
    inventory: tuple[str, ...] | None = None
    if inv_lines is not None:
        inventory = tuple(i for line in inv_lines for i in parse_inventory(line))
    fb = " ".join(" ".join(feedback).split()) if feedback is not None else None
    return ParsedState(location, _sentences(desc), inventory, fb or None)


def _quote(text: str, n: int = _MAX_QUOTE) -> str:
    # A trailing period would double up with the sentence's own.
    text = strip_format_tags(" ".join(text.split())).rstrip(".")
    return '"' + (text if len(text) <= n else text[: n - 3] + "...") + '"'


def _listing(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _action_objects(action: str) -> list[str]:
    """Object phrases of a command: 'unlock chest with key' -> ['chest', 'key']."""
    words = action.strip().split(maxsplit=1)
    if len(words) < 2:
        return []
    rest = words[1]
    if words[0].lower() == "pick" and rest.lower().startswith("up "):
        rest = rest[3:]
    return [_norm_item(p) for p in _PREPOSITIONS.split(rest) if _norm_item(p)]


def _object_states(state: ParsedState, obj: str) -> list[str]:
    """State words said of exactly ``obj``: 'a closed wooden chest', 'the chest is open'."""
    name = re.escape(obj)
    # Adjectives directly in front of the full name, or "<name> is (now) <state>".
    before = re.compile(rf"((?:\b(?:{_STATE_ALT})\s+)+){name}\b", re.IGNORECASE)
    after = re.compile(rf"\b{name}\s+(?:is|are)\s+(?:now\s+)?({_STATE_ALT})\b", re.IGNORECASE)
    texts = list(state.description) + list(state.inventory or ())
    if state.feedback:
        texts.append(state.feedback)
    found: list[str] = []
    for text in texts:
        words = [w for m in before.finditer(text) for w in m.group(1).lower().split()]
        words += [m.group(1).lower() for m in after.finditer(text)]
        found += [w for w in words if w not in found]
    return found


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS and len(w) > 2}


class _Diff:
    """What changed between two parsed states."""

    def __init__(self, before: ParsedState, after: ParsedState, action: str) -> None:
        self.before, self.after = before, after
        self.moved = (
            before.location is not None
            and after.location is not None
            and before.location.lower() != after.location.lower()
        )
        inv_b = list(before.inventory or ())
        inv_a = list(after.inventory or ())
        self.gained = [i for i in inv_a if i not in inv_b]
        self.lost = [i for i in inv_b if i not in inv_a]
        # 'carrot' -> 'sliced carrot': one item whose state changed, not a loss and a gain.
        self.transformed: list[tuple[str, str]] = []
        for old in list(self.lost):
            new = next((g for g in self.gained if g.endswith(" " + old)), None)
            if new is not None:
                self.transformed.append((old, new))
                self.lost.remove(old)
                self.gained.remove(new)
        self.appeared = [s for s in after.description if s not in before.description]
        self.vanished = [s for s in before.description if s not in after.description]
        self.object_changes: list[tuple[str, list[str], list[str]]] = []
        for obj in _action_objects(action):
            s_b, s_a = _object_states(before, obj), _object_states(after, obj)
            if s_b != s_a and s_a:
                self.object_changes.append((obj, s_b, s_a))
        self.world_changed = before.world() != after.world()


def _validity(t: Transition) -> str:
    action = _quote(t.action)
    if t.valid_action:
        if t.admissible_actions:
            n = len(t.admissible_actions)
            return f"The action {action} is admissible here (one of the {n} available commands)."
        return f"The action {action} is a valid command in this state."
    if t.admissible_actions:
        shown = ", ".join(_quote(a) for a in t.admissible_actions[:_MAX_LISTED])
        more = len(t.admissible_actions) - _MAX_LISTED
        tail = f", and {more} more" if more > 0 else ""
        return (
            f"The action {action} is not admissible in this state: it is not among the "
            f"available commands (e.g. {shown}{tail}), so the environment rejects it."
        )
    return f"The action {action} is not admissible in this state, so the environment rejects it."


def _effects(t: Transition, d: _Diff) -> list[str]:
    out: list[str] = []
    here = d.before.location or d.after.location
    if not d.world_changed:
        if t.valid_action:
            out.append(
                "It has no effect on the world: the location, the inventory and the "
                "surroundings stay the same; it only yields information."
            )
        else:
            where = f" (still in {here})" if here else ""
            out.append(
                f"Therefore the state is unchanged{where}: nothing moves, nothing is gained "
                "or lost."
            )
    if d.moved:
        out.append(f"The agent moves from {d.before.location} to {d.after.location}.")
        if d.after.description:
            out.append(f"It now sees: {_quote(d.after.description[0])}.")
    elif d.world_changed and here:
        out.append(f"The agent stays in {here}.")
    if d.gained:
        out.append(f"The inventory gains {_listing(d.gained)}.")
    if d.lost:
        why = "eaten" if t.action.lower().startswith("eat ") else "no longer carried"
        out.append(f"The inventory loses {_listing(d.lost)} ({why}).")
    for old, new in d.transformed:
        out.append(f"The {old} in the inventory is now the {new}.")
    for obj, before, after in d.object_changes:
        was = f" (before: {', '.join(before)})" if before else ""
        out.append(f"The {obj} is now described as {', '.join(after)}{was}.")
    if not d.moved and d.world_changed:
        if d.appeared:
            quoted = "; ".join(_quote(s) for s in d.appeared[:_MAX_LISTED])
            out.append(f"Newly true in the description: {quoted}.")
        if d.vanished:
            quoted = "; ".join(_quote(s) for s in d.vanished[:_MAX_LISTED])
            out.append(f"No longer true: {quoted}.")
    if d.after.feedback and d.after.feedback != d.before.feedback:
        out.append(f"The environment responds {_quote(d.after.feedback)}.")
    elif d.after.feedback:
        out.append(f"The feedback stays {_quote(d.after.feedback)}.")
    return out


def _reward(t: Transition, d: _Diff) -> str:
    if t.reward == 1:
        end = " and the episode ends" if t.done else ""
        return f"This step completes the goal, so the reward is 1{end}."
    if not t.valid_action:
        reason = "An invalid action makes no progress toward the goal"
    elif t.done:
        reason = (
            "The episode ends here without the goal being completed (the game is lost or "
            "the step limit is reached)"
        )
    else:
        reason = "The goal is not completed yet after this step"
    progress = ""
    if t.valid_action and not t.done:
        goal_words = _content_words(t.instruction)
        hits = [g for g in d.gained if _content_words(g) & goal_words]
        if d.moved and _content_words(d.after.location or "") & goal_words:
            hits.append(f"the {d.after.location}")
        if hits:
            progress = f" (the goal mentions {_listing(hits)}: this is progress, not completion)"
    return f"{reason}{progress}, so the reward is 0."


def concise_reasoning(t: Transition) -> str:
    """A short trace (validity, effects, reward) for small models with short contexts."""
    d = _Diff(parse_state(t.state), parse_state(t.next_state), t.action)
    lines = ["Valid action." if t.valid_action else "Invalid action: state unchanged."]
    if d.moved:
        lines.append(f"Moves to {d.after.location}.")
    if d.gained:
        lines.append(f"Gains {_listing(d.gained)}.")
    if d.lost:
        lines.append(f"Loses {_listing(d.lost)}.")
    for obj, _, after in d.object_changes:
        lines.append(f"The {obj} is now {', '.join(after)}.")
    if t.valid_action and not d.world_changed:
        lines.append("No change.")
    lines.append("Goal completed: reward 1." if t.reward == 1 else "Goal not completed: reward 0.")
    return " ".join(lines)


def grounded_reasoning(req: AnnotationRequest, concise: bool = False) -> str:
    """The deterministic reasoning trace for one request (short form when ``concise``)."""
    t = req.transition
    if concise:
        # environment text (locations, items) is quoted unfiltered in the short form
        return strip_format_tags(concise_reasoning(t))
    before, after = parse_state(t.state), parse_state(t.next_state)
    d = _Diff(before, after, t.action)
    lines = [f"The goal is {_quote(t.instruction)}."]
    if req.history:
        prev = ", then ".join(_quote(h.action) for h in req.history)
        lines.append(f"Previously the agent did {prev}.")
    where = f" in {before.location}" if before.location else ""
    lines.append(f"At step {t.step_index}{where}, the agent takes the action {_quote(t.action)}.")
    lines.append(_validity(t))
    lines.extend(_effects(t, d))
    lines.append(_reward(t, d))
    # locations and item names come from the state text unquoted: drop any format tags
    return strip_format_tags(" ".join(lines))


class GroundedTeacher:
    """Offline teacher built from ground truth (no model, no tokens, no cost)."""

    backend = "grounded"
    model = "grounded-v1"
    budget_exhausted = False

    def __init__(self, batch_size: int = 256, concise: bool = False) -> None:
        self.batch_size = batch_size
        self.concise = concise
        if concise:
            self.model = "grounded-concise-v1"

    def annotate(
        self, batch: Sequence[AnnotationRequest], on_result: OnResult | None = None
    ) -> list[Annotation]:
        """Explain every transition of the batch from its recorded ground truth."""
        out: list[Annotation] = []
        for req in batch:
            text = grounded_reasoning(req, concise=self.concise)
            # Same validation as the LLM backends: the trace must embed in <think>.
            try:
                reasoning = parse_reasoning(f"<think>{text}</think>")
            except MalformedAnswerError as err:
                # one odd transition is a recorded failure, never the end of the run
                ann = Annotation(
                    id=req.id,
                    status="failed",
                    backend=self.backend,
                    model=self.model,
                    attempts=1,
                    error=f"malformed answer: {err}",
                    raw=excerpt(text),
                )
            else:
                ann = Annotation(
                    id=req.id,
                    status="ok",
                    reasoning=reasoning,
                    backend=self.backend,
                    model=self.model,
                    attempts=1,
                )
            if on_result is not None:
                on_result(ann)
            out.append(ann)
        return out

    def __repr__(self) -> str:
        return f"GroundedTeacher(model={self.model!r})"
