"""How the grounded experience model drafts its answer to one query, from its tables.

A draft is the next state, the admissible commands, the evidence that decided and, where
the recorded outcome does not settle it, what the won / lost classifiers must judge
(``GroundedModel.predict_batch`` asks them once for every pending draft). In order:
replay (this game recorded this command in this state, or an earlier dream did), a page
edit (MiniWoB++: a click recorded on this page, else the page as the action leaves it),
the map (a ``go`` whose destination is known, dreamt, named or guessed) and the learned
per-verb edit with its feedback template. See components/experience/grounded.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from components.experience.grounded_fit import PAGE_VERB
from components.experience.grounded_outcome import Query, _Draft
from components.experience.grounded_page import (
    FEEDBACK,
    PageClicks,
    click_op,
    fill_page_template,
    page_commands,
    page_edit,
    parse_action,
    render_page,
)
from components.experience.grounded_science import (
    WinGate,
    door_open_behind,
    focus_as_move,
    science_parse,
    science_rule,
    win_conditions,
)
from components.experience.grounded_science_edits import science_feedback, science_names
from components.experience.grounded_state import (
    UNCHANGED_FEEDBACK,
    _apply_edit,
    _parse,
    _top,
    _world_key,
    fill_template,
    render_state,
    split_cached,
)
from components.memory import OPPOSITE, EpisodeMemory
from components.schema import Task

# evidence labels (also the keys of the env's counters)
EVIDENCE_KINDS = ("replay", "synthetic_replay", "map", "edit", "unknown_room")
REPLAY, SYNTHETIC_REPLAY, MAP, EDIT, UNKNOWN_ROOM = EVIDENCE_KINDS


class OutcomeDrafts:
    """The answer to one query from the tables (a part of GroundedModel)."""

    # the GroundedModel fields these methods read
    settings: Any
    pages: bool
    science: bool
    exact: dict[tuple[str, str, str], Counter]
    exact_after: dict[tuple[str, str, str, str], Counter]
    synthetic: dict[tuple[str, str, str], Counter]
    exits: dict[tuple[str, str, str], Counter]
    room_views: dict[tuple[str, str], Counter]
    room_view_steps: dict[tuple[str, str, str], set[int]]
    outcome_steps: dict[tuple[str, str, str, str], set[int]]
    admissible_by_state: dict[tuple[str, str], tuple[str, ...]]
    templates: dict[tuple[str, str, bool], Counter]
    edits: dict[tuple[str, str], str]
    page_clicks: PageClicks
    page_click_ops: dict[str, str]
    win_gate: WinGate | None
    _cache: Any

    def _draft(self, query: Query) -> _Draft:
        task, memory, state, action, admissible, rooms = query
        tid = task.task_id
        # a generated task plays in its parent's game: that game's map and recorded
        # outcomes (won judged anew below); its own dreams are kept under its own id
        game = self._game_of(task)
        if not self.settings.history:
            memory = EpisodeMemory.replay(memory.instruction, state)
            rooms = None
        if self.settings.replay:
            for table, evidence, owner in (
                (self.exact, REPLAY, game),
                (self.synthetic, SYNTHETIC_REPLAY, tid),
            ):
                key = (owner, _world_key(state), action.lower())
                if key in table:
                    outcomes = table[key]
                    # the recorded endings disagree: the state text does not decide them
                    undecided = not self.science and len({o[2:] for o in outcomes}) > 1
                    if undecided and evidence == REPLAY:
                        after = (*key[:2], memory.last_action.lower(), key[2])
                        if len({o[2:] for o in self.exact_after.get(after, ())}) == 1:
                            outcomes, undecided = self.exact_after[after], False
                    if self.science and evidence == REPLAY and len(outcomes) > 1:
                        at = memory.n_steps + 1
                        ns, _, won, lost = _nearest(
                            outcomes, lambda o, key=key: self.outcome_steps.get((*key, o[0])), at
                        )
                    else:
                        ns, _, won, lost = _top(outcomes)
                    if rooms and not (self.science or self.pages):  # TextWorld's rooms
                        ns = _as_left(ns, state, rooms)
                    adm, fallback = self._admissible(game, ns, admissible, _played(memory, action))
                    why = "This command was seen in this state of this game: same outcome."
                    if evidence == SYNTHETIC_REPLAY:
                        why = "This command was dreamt in this state before: same outcome."
                    if won and not self._win_possible(memory, state, action):
                        # a focus or a connect leaves the state as it was: the recorded
                        # win needed what this episode has not done
                        won = False
                        why = "Seen winning here, but not without what every win needed."
                    draft = _Draft(ns, bool(won), bool(lost), adm, evidence, fallback, why)
                    draft.score = float(bool(won))  # a recorded outcome is certain
                    # judged anew: a generated task's goal is not the recorded one; and a
                    # ScienceWorld state's text does not show what was focused on, so the
                    # same command in the same state can win after another history (a
                    # recorded non-ending; 5 of 15 replayed dreamt power-component losses
                    # won for real at a wait1 after the circuit was closed)
                    if undecided:
                        draft.why = "This command was seen here ending both ways: judged anew."
                    if undecided or _is_generated(task) or (self.science and not (won or lost)):
                        draft.memory, draft.action, draft.current = memory, action, admissible
                        draft.state = state
                        if self.science:
                            draft.mirror = focus_as_move(memory, state, action)
                    return draft
        if self.pages and (edited := page_edit(state, action)) is not None:
            if self.settings.replay and (clicked := self._page_click_draft(query, game)):
                return clicked
            return self._page_draft(query, edited)
        location, surroundings, inventory = split_cached(state)
        verb, x, prep, y = science_parse(action) if self.science else _parse(action)
        valid = action in admissible
        nloc, nsur, ninv = location, surroundings, inventory
        evidence = EDIT
        fixed = None
        if self.science:
            fixed = science_rule(verb, x, y, location, surroundings, inventory, action)
        if fixed is not None:  # ScienceWorld's own answer: doors, nothing to mix
            evidence, (why, feedback, nsur) = EDIT, fixed
        elif verb == "go" and valid:
            dests = self.exits.get((game, location, x)) if self.settings.replay else None
            if dests:
                nloc = _top(dests)
                if rooms and nloc in rooms:
                    nsur = rooms[nloc]
                elif self.room_views.get((game, nloc)):
                    nsur = self._view_at(game, nloc, memory.n_steps + 1)
                evidence, why = MAP, f"Going {x} from the {location} leads to the {nloc}."
                feedback = f"You are in the {nloc}."
            elif (dreamt := self._dreamt_room(task, location, x)) is not None:
                nloc, view = dreamt
                nsur = (rooms or {}).get(nloc) or view
                evidence = UNKNOWN_ROOM
                why = f"No recorded episode went {x} from the {location}: the {nloc} is dreamt."
                feedback = f"You are in the {nloc}."
            elif (named := self._named_room(game, x, rooms)) not in (None, location):
                # ScienceWorld names where it goes ("go to hallway"): a room of this game
                nloc = named
                nsur = (rooms or {}).get(nloc) or _top(self._views(game, nloc))
                evidence, why = MAP, f"The command names the {nloc}, a room of this game."
                feedback = f"You move to the {nloc}."
            elif (guess := self._guess_room(game, location, x)) is not None:
                nloc = guess
                nsur = (rooms or {}).get(nloc) or self._view_at(game, nloc, memory.n_steps + 1)
                evidence, why = MAP, f"The {nloc} has an unexplored exit back {OPPOSITE[x]}."
                feedback = f"You are in the {nloc}."
            else:
                evidence = UNKNOWN_ROOM
                why = f"Where going {x} from the {location} leads is unknown here."
                feedback = "You can't go that way."
            if self.science and nloc != location:
                nsur = door_open_behind(nsur, location)
        else:
            op = self.edits.get((verb, prep), "none") if valid else "none"
            if op != "none":
                nsur, ninv = _apply_edit(op, surroundings, inventory, x, prep, y)
            names, fixed_fb = (x, y), None
            if self.science:  # its fixed answers, else a learned template with its names
                names = science_names(surroundings, inventory, verb, x, y)
                fixed_fb = science_feedback(action, location, surroundings, inventory)
            feedback = (valid and fixed_fb) or self._feedback(verb, prep, valid, *names)
            why = (
                f"'{verb}' is {'admissible' if valid else 'not admissible'} here; "
                f"learned effect: {op.removeprefix('sci_').replace('_', ' ')}."
            )
        next_state = render_state(nloc, nsur, ninv, feedback)
        adm, fallback = self._admissible(game, next_state, admissible, _played(memory, action))
        draft = _Draft(next_state, False, False, adm, evidence, fallback, why, replayed=False)
        draft.memory, draft.action, draft.current = memory, action, admissible
        draft.state = state
        if self.science:
            draft.mirror = focus_as_move(memory, state, action)
        return draft

    def _page_draft(self, query: Query, edited: tuple[Any, str, str, bool]) -> _Draft:
        """A page action's draft: the page as ``page_edit`` leaves it, a learned feedback."""
        task, memory, state, action, admissible, _ = query
        if not self.settings.history:
            memory = EpisodeMemory.replay(memory.instruction, state)
        page, verb, kind, valid = edited
        if verb == "click" and valid and (op := self.page_click_ops.get(kind)):
            page = click_op(op, page, parse_action(action).ref)
        feedback = self._page_feedback(verb, kind, valid, action)
        next_state = render_page(page, feedback)
        recorded = self.admissible_by_state.get((task.task_id, _world_key(next_state)))
        # a page edit changes values, and a click op closes a list: the commands left
        adm = recorded or page_commands(next_state, admissible)
        what = f"a {kind}" if kind else "no element"
        why = f"'{verb}' on {what}: {'valid' if valid else 'invalid'}; the page as it leaves it."
        draft = _Draft(next_state, False, False, adm, EDIT, False, why, replayed=False)
        draft.memory, draft.action, draft.current, draft.state = memory, action, admissible, state
        return draft

    def _page_click_draft(self, query: Query, game: str) -> _Draft | None:
        """A click whose page this game recorded without the same element ids: the page
        it showed; its ending where every recording agrees, else judged anew."""
        task, memory, state, action, admissible, _ = query
        hit = self.page_clicks.lookup(game, state, action)
        if hit is None:
            return None
        if not self.settings.history:
            memory = EpisodeMemory.replay(memory.instruction, state)
        body, template, ending = hit
        kind = page_edit(state, action)[2]
        feedback = fill_page_template(template, action, kind)
        feedback = feedback or self._page_feedback("click", kind, True, action)
        next_state = f"{body}\n{FEEDBACK}{feedback}"
        adm, fallback = self._admissible(game, next_state, admissible, _played(memory, action))
        if not adm:  # a page no list was recorded for: the click as it edits this page
            return None
        why = "This click was seen on this page of this game: the page it showed."
        won, lost = ending or (False, False)
        draft = _Draft(next_state, bool(won), bool(lost), adm, REPLAY, fallback, why)
        draft.score = float(bool(won))
        if ending is None or _is_generated(task):
            draft.why = "This click was seen on this page ending both ways: judged anew."
            draft.memory, draft.action, draft.current = memory, action, admissible
            draft.state = state
        return draft

    def _page_feedback(self, verb: str, kind: str, valid: bool, action: str) -> str:
        keys = [(PAGE_VERB + verb, kind, valid), (PAGE_VERB + verb, "", valid)]
        keys += [k for k in self.templates if k[0].startswith(PAGE_VERB) and k[2] == valid]
        for key in keys:
            for template, _ in (self.templates.get(key) or Counter()).most_common(5):
                text = fill_page_template(template, action, kind)
                if text is not None:
                    return text
        return UNCHANGED_FEEDBACK

    def _view_at(self, task_id: str, room: str, step: int) -> str:
        """The recorded view of ``room``: on ScienceWorld the one seen nearest ``step``."""
        views = self.room_views[(task_id, room)]
        if not self.science:
            return _top(views)
        return _nearest(views, lambda v: self.room_view_steps.get((task_id, room, v)), step)

    def _feedback(self, verb: str, prep: str, valid: bool, x: str, y: str) -> str:
        key = (verb, prep, valid)
        top = self._cache.templates.get(key)
        if top is None:  # the (fixed after fitting) five most frequent templates
            counts = self.templates.get(key) or self.templates.get((verb, prep, True))
            top = self._cache.templates[key] = [t for t, _ in (counts or Counter()).most_common(5)]
        for template in top:
            text = fill_template(template, x, y)
            if text is not None:
                return text
        return UNCHANGED_FEEDBACK

    def _win_possible(self, memory: EpisodeMemory, state: str, action: str) -> bool:
        """Whether ``action`` may win here: ScienceWorld's gate (``WinGate``), else always."""
        if self.win_gate is None:
            return True
        conditions = win_conditions(memory, state, action)
        return self.win_gate.allows(memory.instruction, action, conditions)


def _as_left(next_state: str, state: str, rooms: dict[str, str]) -> str:
    """A recorded move into a room this episode saw before: that room as the episode left
    it (a recording opened no chest there; TextWorld changes nothing out of sight)."""
    nloc, nsur, ninv = split_cached(next_state)
    left = rooms.get(nloc)
    if left is None or left == nsur or nloc == split_cached(state)[0]:
        return next_state
    return render_state(nloc, left, ninv, next_state.rpartition("\nFeedback: ")[2])


def _is_generated(task: Task) -> bool:
    return bool(task.generated)


def _nearest(counts: Counter, steps_of: Any, step: int) -> Any:
    """The key of ``counts`` seen nearest ``step`` (``steps_of(key)``: its steps, or None),
    the most counted on ties, then the first counted."""

    def distance(key: Any) -> int:
        seen = steps_of(key)
        return min(abs(step - s) for s in seen) if seen else 1 << 30

    return min(counts, key=lambda k: (distance(k), -counts[k]))


def _played(memory: EpisodeMemory, action: str) -> list[str]:
    """The episode's commands in order, ``action`` last."""
    return [*memory.history, action]
