"""The cpu-profile experience model: grounded in replayed real experience, learned edits.

An LLM experience model does not fit two cores (a 1M-parameter one predicted no success
ever on the first main). This one answers the same question, (task, episode history,
state, action) -> (reasoning, next state, reward, done, admissible commands), from what
real offline transitions show, in order of evidence:

1. **replay**: this exact (game, world state, command) was seen in real data (or, with
   co-evolution, in earlier synthetic rounds) -> its recorded outcome; where the recorded
   endings disagree (a page whose text does not show what was clicked), those recorded
   after the same previous command, else the classifiers judge the ending anew;
2. **map**: a ``go`` whose destination in this game is known -> that room as this episode
   last left it, else as real data first showed it;
3. **edit**: otherwise the command's effect is predicted by an edit learned per verb from
   real transitions of *other* games too: which of a few state-edit operators (the
   object moves to the inventory, out of it, onto/into something, a container or door
   opens/closes/unlocks, nothing changes) reproduces that verb's real transitions best,
   and the verb's most frequent feedback template (``You take the {X} from the {Y}.``)
   filled with the command's objects. On TextWorld an exit no real episode took is
   dreamt (grounded_rooms.py ``_dream_map``): one leads to the room a goal-only treasure
   hunt names, with the thing on its floor, where no real episode reached it; the others
   to dead ends; elsewhere an unknown room is predicted as "not reached".
Reward and termination come from two class-balanced logistic regressions (won, lost) on
features of the command against the instruction's steps and the episode's instruction
pointer (components/memory.py); their thresholds are chosen on held-out train games
(rewards are rare: ~5% of transitions). A replayed outcome keeps its recorded reward.
On text games a predicted win also needs what every real win had (``win_requirements``:
the last clause's verb, the things named exactly, no conflict on where): RL found the
commands no recorded episode played, ``drop sponge`` for "place the sponge into the box".
Two envs get more: on web pages (MiniWoB++, ``pages``) an action's effect is the page
edit of grounded_page.py and the classifiers also see how the page's values meet the
instruction; on ScienceWorld tasks (``science``) they see grounded_science.py's focus /
box / circuit relations and a word prior learned out of fold, a win (replayed ones too)
needs what every real win of its kind had (``WinGate``), ``go to <room>`` walks only
through an open door (the door walked through is open on the other side too), and every
command list also holds the expert's next command (as the real env's lists do).
Admissible commands of the next state: recorded ones for that world state, else composed
from the compact state by TextWorld's command grammar (grounded_commands.py: what is held,
open, closed, locked, on or in what), else (a state that does not parse) those of the
most similar recorded state of the same room (counted as a fallback).

Every answer carries a short reasoning (which evidence decided) and is rendered in the
reasoning-first answer format of the LLM model (``<think>``, ``<state>``, ``<reward>``),
so fidelity and the judge read both models the same way.

``predict_batch`` answers many (task, memory, state, action) queries at once, exactly as
``predict`` answers each: the tables first, then one call of each classifier for every
query they decide. The classifiers predict with numpy (torch only fits them).

The state text (parse, render, edit operators) is in grounded_state.py; the draft of one
answer from the tables (replay, page, map, edit) in grounded_drafts.py; the outcome, its
features and classifiers in grounded_outcome.py; fitting in grounded_fit.py; rooms, exits
and command lists in grounded_rooms.py; the curriculum's task variants in
grounded_variants.py; the page and ScienceWorld parts in grounded_page.py and
grounded_science.py.
"""

from __future__ import annotations

import pickle
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.experience.grounded_commands import CommandRoles
from components.experience.grounded_drafts import OutcomeDrafts
from components.experience.grounded_fit import fit_tables

# the state and outcome parts live in their own modules; the names other code imports
# from here stay importable
from components.experience.grounded_outcome import (  # noqa: F401
    Outcome,
    Query,
    _Draft,
    _LogisticRegression,
    best_f1_threshold,
    episode_rows,
    meets,
    outcome_features,
    steps_lost,
)
from components.experience.grounded_page import (
    PageClicks,
)
from components.experience.grounded_rooms import RoomKnowledge
from components.experience.grounded_science import (
    WinGate,
    WordPrior,
    circuit_closed,
)
from components.experience.grounded_state import (  # noqa: F401
    _NEUTRAL,
    EDIT_OPERATORS,
    UNCHANGED_FEEDBACK,
    _apply_edit,
    _content,
    _parse,
    _top,
    _world_key,
    apply_edit,
    exits_of,
    feedback_template,
    fill_template,
    listed_objects,
    parse_command,
    render_state,
    split_cached,
    world_key,
)
from components.experience.grounded_variants import TaskVariants
from components.memory import EpisodeMemory
from components.schema import Task, Trajectory

MODEL_FILE = "grounded.pkl"
FORMAT_VERSION = 1
# saved models name the classifiers' class by the path they always had (this module):
# saves load before and after the split, byte for byte the same
_LogisticRegression.__module__ = __name__


class _Cache:
    """What prediction derives from the fitted tables (rebuilt lazily; never saved)."""

    ADMISSIBLE_LIMIT = 1 << 15

    def __init__(self) -> None:
        self.templates: dict[tuple[str, str, bool], list[str]] = {}
        self.rooms: dict[tuple[str, str], list[tuple[frozenset[str], tuple[str, ...]]]] = {}
        self.admissible: dict[tuple[str, str], tuple[tuple[str, ...], bool]] = {}
        self.roles: CommandRoles | None = None
        self.donors: dict[tuple[str, str], str | None] = {}
        # the dreamt part of each game's map (grounded_rooms.py ``_dreamt_room``)
        self.dreamt: dict[str, dict[tuple[str, str], tuple[str, str]]] = {}
        self.room_names: list[str] | None = None

    def remember_admissible(
        self, key: tuple[str, str], value: tuple[tuple[str, ...], bool]
    ) -> None:
        if len(self.admissible) >= self.ADMISSIBLE_LIMIT:
            self.admissible.clear()
        self.admissible[key] = value


@dataclass
class GroundedSettings:
    """Switches of the model (the ablations) and its fit seed."""

    replay: bool = True  # ablation "w/o replay": no recorded outcome is looked up
    history: bool = True  # ablation "w/o history": no episode memory (pointer, rooms)
    seed: int = 0
    threshold_holdout: float = 0.2  # share of train games the thresholds are chosen on


@dataclass
class GroundedModel(OutcomeDrafts, RoomKnowledge, TaskVariants):
    """See the module docstring. ``fit`` on real train trajectories, then ``predict``."""

    settings: GroundedSettings = field(default_factory=GroundedSettings)
    exact: dict[tuple[str, str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    # the same outcomes keyed by the episode's previous command too: a page whose text does
    # not show what was clicked (click-button-sequence's ONE then TWO) ends differently
    # after different clicks; read only where ``exact`` disagrees on how the episode ends
    exact_after: dict[tuple[str, str, str, str], Counter] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    synthetic: dict[tuple[str, str, str], Counter] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    admissible_by_state: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    states_by_room: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    exits: dict[tuple[str, str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    room_views: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    # ScienceWorld's world changes as steps pass (plants grow) where its text does not show
    # it: the steps each (game, room, view) and each replayed (game, state, command, next
    # state) was seen after, so the one nearest the episode's step is replayed
    room_view_steps: dict[tuple[str, str, str], set[int]] = field(default_factory=dict)
    outcome_steps: dict[tuple[str, str, str, str], set[int]] = field(default_factory=dict)
    initial: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    templates: dict[tuple[str, str, bool], Counter] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    edits: dict[tuple[str, str], str] = field(default_factory=dict)
    # web pages: recorded clicks keyed without element ids, and what a click on an element
    # of a kind does to the rest of the page (an autocomplete entry fills its field)
    page_clicks: PageClicks = field(default_factory=PageClicks)
    page_click_ops: dict[str, str] = field(default_factory=dict)
    guessed: dict[tuple[str, str, str], str | None] = field(default_factory=dict)
    won_model: _LogisticRegression | None = None
    lost_model: _LogisticRegression | None = None
    won_threshold: float = 0.5
    lost_threshold: float = 0.5
    pages: bool = False  # fitted on web pages (MiniWoB++): page edits and page features
    science: bool = False  # fitted on ScienceWorld tasks: science features, word prior
    word_prior: WordPrior | None = None
    win_gate: WinGate | None = None  # ScienceWorld: what every real win of a task kind had
    # text games: {outcome feature column: the value every real win had} (win_requirements)
    win_requires: dict[int, float] = field(default_factory=dict)
    # ScienceWorld: each game's expert path; its real env lists the path's commands that
    # name things in view, so a composed list must too (the policy learned to look there)
    gold_path: dict[str, tuple[str, ...]] = field(default_factory=dict)
    fit_stats: dict[str, Any] = field(default_factory=dict)
    _cache: _Cache = field(default_factory=_Cache, repr=False, compare=False)

    # -- fitting ---------------------------------------------------------------------------

    def fit(self, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
        """Index real transitions, learn edits and templates, fit won/lost classifiers."""
        self.fit_stats = fit_tables(self, trajectories)
        self._cache = _Cache()  # derived from the tables just built
        return self.fit_stats

    # -- co-evolution ------------------------------------------------------------------------

    def add_synthetic(self, trajectories: Iterable[Trajectory]) -> int:
        """Remember synthetic outcomes (later rounds replay them: a consistent dream),
        losses included: a dreamt loss must end the episode again when replayed."""
        n = 0
        for traj in trajectories:
            for s, lost in steps_lost(traj):
                key = (s.task_id, world_key(s.state), s.action.lower())
                if key in self.exact:
                    continue
                won = s.done and s.reward == 1
                self.synthetic[key][(s.next_state, s.reward, won, lost)] += 1
                n += 1
        return n

    # -- prediction --------------------------------------------------------------------------

    def initial_state(self, task_id: str) -> tuple[str, tuple[str, ...]] | None:
        """The recorded first state (and its admissible commands) of a known task."""
        return self.initial.get(task_id)

    def predict(
        self,
        task: Task,
        memory: EpisodeMemory,
        state: str,
        action: str,
        admissible: Sequence[str],
        rooms: dict[str, str] | None = None,
    ) -> Outcome:
        """The next state, reward, termination and admissible commands of ``action``.

        ``memory`` is the episode so far (its instruction pointer); ``rooms`` maps room
        names to how this episode last saw them (a room the agent comes back to is as it
        left it).
        """
        return self.predict_batch([Query(task, memory, state, action, admissible, rooms)])[0]

    def predict_batch(self, queries: Sequence[Query]) -> list[Outcome]:
        """``predict`` of many queries: the same outcomes, each classifier called once.

        Every query is answered from the tables first (a draft); the drafts whose reward
        and termination the classifiers decide get their features stacked into one matrix.
        """
        drafts = [self._draft(q) for q in queries]
        pending = [d for d in drafts if d.memory is not None]
        if pending:
            asked = [(d, d.memory, d.action, d.current) for d in pending]
            mirrored = [d for d in pending if d.mirror is not None]
            asked += [(d, *d.mirror, (*d.current, d.mirror[1])) for d in mirrored]
            feats = np.asarray(
                [
                    outcome_features(
                        mem,
                        action,
                        current,
                        d.state if self.pages or self.science else None,
                        self.word_prior.score(mem.instruction, action)
                        if self.word_prior is not None
                        else None,
                    )
                    for d, mem, action, current in asked
                ],
                np.float32,
            )
            allowed = None
            if self.win_gate is not None:
                allowed = np.asarray(
                    [self._win_possible(mem, d.state, action) for d, mem, action, _ in asked]
                )
            if self.win_requires:
                allowed = meets(feats, self.win_requires) & (True if allowed is None else allowed)
            rows = self._classify_rows(feats, allowed)
            n = len(pending)
            for d, (won, _, score) in zip(mirrored, rows[n:], strict=True):
                d.mirror_won = (won, score)  # the mirrored move's verdict: won wins
            for d, (won, lost, score) in zip(pending, rows[:n], strict=True):
                if d.mirror_won is not None and d.mirror_won[0]:
                    won, lost, score = True, False, max(score, d.mirror_won[1])
                if (
                    self.science
                    and not won
                    and not d.action.lower().startswith("focus on ")  # a wrong one loses
                    and circuit_closed(d.memory)
                ):
                    won, lost, score = True, False, 1.0  # lit on the tick after it closed
                d.decide(won, lost, score)
        return [d.outcome() for d in drafts]

    def _classify_rows(
        self, feats: np.ndarray, allowed: np.ndarray | None = None
    ) -> list[tuple[bool, bool, float]]:
        """(won, lost, won score) per feature row: each classifier called once; a row
        ``allowed`` marks False is never won."""
        n = len(feats)
        if self.won_model is not None:
            scores = self.won_model.proba(feats).astype(np.float64)
            won = scores >= self.won_threshold  # compared as Python floats (float64)
            if allowed is not None:
                won &= allowed
        else:
            scores, won = np.zeros(n), np.zeros(n, dtype=bool)
        lost = np.zeros(n, dtype=bool)
        if self.lost_model is not None:  # compared in float32, as a numpy scalar was
            lost = ~won & (self.lost_model.proba(feats) >= np.float32(self.lost_threshold))
        return [
            (bool(w), bool(lo), float(s))
            for w, lo, s in zip(won.tolist(), lost.tolist(), scores.tolist(), strict=True)
        ]

    # -- saving ------------------------------------------------------------------------------

    def save(self, out_dir: Path) -> None:
        """Pickle the model (plain containers + numpy arrays) under ``out_dir``."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: _plain(v) for k, v in self.__dict__.items() if k not in ("synthetic", "_cache")}
        with (out_dir / MODEL_FILE).open("wb") as f:
            pickle.dump({"version": FORMAT_VERSION, "state": state}, f)

    @classmethod
    def load(cls, path: Path) -> GroundedModel:
        """A model saved by ``save`` (its synthetic memory starts empty)."""
        with (Path(path) / MODEL_FILE).open("rb") as f:
            data = pickle.load(f)  # our own artifact, written by save()
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{path}: grounded model format {data.get('version')}, expected {FORMAT_VERSION}"
            )
        model = cls()
        for k, v in data["state"].items():
            setattr(model, k, _restore(getattr(model, k), v))
        return model


def is_grounded_dir(path: Path) -> bool:
    """``path`` holds a saved grounded experience model."""
    return (Path(path) / MODEL_FILE).exists()


def _plain(v: Any) -> Any:
    if isinstance(v, defaultdict):
        return dict(v)
    return v


def _restore(default: Any, v: Any) -> Any:
    if isinstance(default, defaultdict):
        out = type(default)(default.default_factory)
        out.update(v)
        return out
    return v
