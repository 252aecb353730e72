"""The cpu-profile experience model: grounded in replayed real experience, learned edits.

An LLM experience model does not fit two cores (a 1M-parameter one predicted no success
ever, FINDINGS.md §2). This one answers the same question, (task, episode history,
state, action) -> (reasoning, next state, reward, done, admissible commands), from what
real offline transitions show, in order of evidence:

1. **replay**: this exact (game, world state, command) was seen in real data (or, with
   co-evolution, in earlier synthetic rounds) -> its recorded outcome;
2. **map**: a ``go`` whose destination in this game is known -> that room as this episode
   last left it, else as real data first showed it;
3. **edit**: otherwise the command's effect is predicted by an edit learned per verb from
   real transitions of *other* games too: which of a few state-edit operators (the
   object moves to the inventory, out of it, onto/into something, a container or door
   opens/closes/unlocks, nothing changes) reproduces that verb's real transitions best,
   and the verb's most frequent feedback template (``You take the {X} from the {Y}.``)
   filled with the command's objects. An unknown room is predicted as "not reached".
Reward and termination come from two class-balanced logistic regressions (won, lost) on
features of the command against the instruction's steps and the episode's instruction
pointer (components/memory.py); their thresholds are chosen on held-out train games
(rewards are rare: ~5% of transitions). A replayed outcome keeps its recorded reward.
Admissible commands of the next state: recorded ones for that world state, else those of
the most similar recorded state of the same room (counted as a fallback).

Every answer carries a short reasoning (which evidence decided) and is rendered in the
reasoning-first answer format of the LLM model (``<think>``, ``<state>``, ``<reward>``),
so fidelity and the judge read both models the same way.

``predict_batch`` answers many (task, memory, state, action) queries at once, exactly as
``predict`` answers each: the tables first, then one call of each classifier for every
query they decide. The classifiers predict with numpy (torch only fits them).
"""

from __future__ import annotations

import pickle
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from components.memory import (
    OPPOSITE,
    VERB_WORDS,
    VERBS,
    EpisodeMemory,
    command_content,
    instruction_steps,
    split_state,
    verb_of,
    words,
)
from components.schema import Task, Trajectory, Transition

MODEL_FILE = "grounded.pkl"
FORMAT_VERSION = 1
_WS = re.compile(r"\s+")
_NEUTRAL = frozenset(OPPOSITE)  # words a command may hold without naming a visible object
_PREPS = (" from ", " into ", " on ", " with ", " in ")
UNCHANGED_FEEDBACK = "Nothing happens."

# evidence labels (also the keys of the env's counters)
REPLAY, SYNTHETIC_REPLAY, MAP, EDIT, UNKNOWN_ROOM = (
    "replay",
    "synthetic_replay",
    "map",
    "edit",
    "unknown_room",
)


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


# -- reward / termination classifier -------------------------------------------------------


def outcome_features(mem: EpisodeMemory, command: str, admissible: Sequence[str]) -> list[float]:
    """Features of (instruction steps, pointer, command) for the won / lost classifiers."""
    sw = mem.step_words
    n = len(sw)
    last = sw[-1] if sw else set()
    p = mem.pointer
    ahead = sw[p] if p < n else set()
    verb = verb_of(command)
    objects = _content(command)  # the command's content words (memory.overlap's)
    lexicon = VERB_WORDS.get(verb)
    goal = set().union(*sw) if sw else set()
    in_goal = len(objects & goal) / len(objects) if objects else 0.0
    last_overlap = len(objects & last) / len(objects) if objects else 0.0
    last_verb = float(bool(lexicon and lexicon & last))
    return [
        last_overlap,
        last_verb,
        last_overlap * last_verb,
        len(objects & ahead) / len(objects) if objects else 0.0,
        float(bool(lexicon and lexicon & ahead)),
        float(p >= n - 1),
        float(p == n - 1) * last_overlap,
        float(n == 1),
        in_goal,
        float(command in admissible),
        float(verb == "take") * (1.0 - in_goal),
        *(float(verb == v) for v in (*VERBS, "other")),
    ]


class _LogisticRegression:
    """Class-balanced L2 logistic regression (LBFGS on standardised features).

    Fitted with torch; the fitted parameters are kept as float32 numpy arrays, so
    ``proba`` is plain numpy (models pickled with torch tensors are converted on load).
    """

    mu: np.ndarray
    sd: np.ndarray
    w: np.ndarray
    b: np.ndarray

    def fit(self, x: np.ndarray, y: np.ndarray, l2: float = 1e-3) -> _LogisticRegression:
        import torch

        xt = torch.tensor(x, dtype=torch.float32)
        yt = torch.tensor(y, dtype=torch.float32)
        mu, sd = xt.mean(0), xt.std(0) + 1e-6
        xn = (xt - mu) / sd
        w = torch.zeros(xt.shape[1], requires_grad=True)
        b = torch.zeros(1, requires_grad=True)
        pos = yt.mean().clamp(1e-4, 1 - 1e-4)
        weights = torch.where(yt > 0, 0.5 / pos, 0.5 / (1 - pos))  # rare wins count as much
        opt = torch.optim.LBFGS([w, b], lr=0.5, max_iter=300)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            z = xn @ w + b
            bce = torch.nn.functional.binary_cross_entropy_with_logits(z, yt, reduction="none")
            loss = (weights * bce).mean() + l2 * (w**2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        self.__setstate__({"mu": mu, "sd": sd, "w": w.detach(), "b": b.detach()})
        return self

    def __setstate__(self, state: dict[str, Any]) -> None:
        # parameters as float32 numpy arrays, whatever held them (older pickles: tensors)
        for k, v in state.items():
            if hasattr(v, "detach"):
                v = v.detach().cpu().numpy()
            setattr(self, k, np.asarray(v, dtype=np.float32))

    def proba(self, x: np.ndarray) -> np.ndarray:
        """P(y = 1) per row of ``x`` (float32; each row computed the same in any batch)."""
        xn = (np.asarray(x, dtype=np.float32) - self.mu) / self.sd
        z = (xn * self.w).sum(axis=1, dtype=np.float32) + self.b
        with np.errstate(over="ignore"):
            return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)


def best_f1_threshold(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(threshold, F1) maximising F1 of ``p >= threshold`` (0.5 when y has no positive).

    Thresholds on a logit grid (class-balanced scores of rare wins sit above .95); of the
    thresholds that tie at the best F1, the middle one: held-out wins are few, so F1 is
    flat over a range, and its lower edge overfits to the held-out games' hardest negative.
    """
    if not y.any():
        return 0.5, 0.0
    grid = 1.0 / (1.0 + np.exp(-np.arange(-5.0, 7.0 + 1e-9, 0.1)))
    f1s = []
    for t in grid:
        pred = p >= t
        tp = int((pred & (y == 1)).sum())
        fp, fn = int((pred & (y == 0)).sum()), int((~pred & (y == 1)).sum())
        f1s.append(2 * tp / max(1, 2 * tp + fp + fn))
    best = max(f1s)
    ties = [float(t) for t, f in zip(grid, f1s, strict=True) if f >= best - 1e-12]
    return ties[len(ties) // 2], best


def episode_rows(
    trajectories: Iterable[Trajectory],
) -> Iterable[tuple[EpisodeMemory, Transition, bool]]:
    """Every transition with the episode memory before it and whether it lost the game.

    The memory is updated in place after each yield: use it before asking for the next.
    """
    for traj in trajectories:
        if not traj.steps:
            continue
        mem = EpisodeMemory.replay(traj.steps[0].instruction, traj.initial_state)
        last = len(traj.steps) - 1
        for i, step in enumerate(traj.steps):
            # the episode ended without the reward and not by the step limit: lost
            lost = i == last and not traj.success and not traj.truncated and step.done
            yield mem, step, lost
            mem.update(step.action, step.next_state)


# -- the model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One predicted step."""

    next_state: str
    reward: int
    won: bool
    lost: bool
    admissible: tuple[str, ...]
    evidence: str  # REPLAY, SYNTHETIC_REPLAY, MAP, EDIT or UNKNOWN_ROOM
    admissible_fallback: bool
    reasoning: str
    win_score: float = 0.0  # the won classifier's probability (recorded outcomes: 0 or 1)


class Query(NamedTuple):
    """One question to the model (``predict``'s arguments)."""

    task: Task
    memory: EpisodeMemory
    state: str
    action: str
    admissible: Sequence[str]
    rooms: dict[str, str] | None = None


@dataclass
class _Draft:
    """An outcome as the tables answer it, before the classifiers decide (when they do)."""

    next_state: str
    won: bool
    lost: bool
    admissible: tuple[str, ...]
    evidence: str
    fallback: bool
    why: str
    replayed: bool = True
    score: float = 0.0
    memory: EpisodeMemory | None = None  # set when the classifiers decide the outcome
    action: str = ""
    current: Sequence[str] = ()

    def decide(self, won: bool, lost: bool, score: float) -> None:
        self.won, self.lost = won, lost
        if self.replayed:  # a generated task: the recorded next state, the reward anew
            self.why += " The task is generated: whether it is won is judged anew."
            return
        self.score = score
        if won:
            self.why += " It completes the task's last step: reward 1."
        elif lost:
            self.why += " It makes the task impossible: the episode is lost."

    def outcome(self) -> Outcome:
        return Outcome(
            self.next_state,
            int(self.won),
            self.won,
            self.lost and not self.won,
            self.admissible,
            self.evidence,
            self.fallback,
            self.why,
            self.score,
        )


class _Cache:
    """What prediction derives from the fitted tables (rebuilt lazily; never saved)."""

    ADMISSIBLE_LIMIT = 1 << 15

    def __init__(self) -> None:
        self.templates: dict[tuple[str, str, bool], list[str]] = {}
        self.rooms: dict[tuple[str, str], list[tuple[frozenset[str], tuple[str, ...]]]] = {}
        self.admissible: dict[tuple[str, str], tuple[tuple[str, ...], bool]] = {}

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
class GroundedModel:
    """See the module docstring. ``fit`` on real train trajectories, then ``predict``."""

    settings: GroundedSettings = field(default_factory=GroundedSettings)
    exact: dict[tuple[str, str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    synthetic: dict[tuple[str, str, str], Counter] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    admissible_by_state: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    states_by_room: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    exits: dict[tuple[str, str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    room_views: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    initial: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    templates: dict[tuple[str, str, bool], Counter] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    edits: dict[tuple[str, str], str] = field(default_factory=dict)
    guessed: dict[tuple[str, str, str], str | None] = field(default_factory=dict)
    won_model: _LogisticRegression | None = None
    lost_model: _LogisticRegression | None = None
    won_threshold: float = 0.5
    lost_threshold: float = 0.5
    fit_stats: dict[str, Any] = field(default_factory=dict)
    _cache: _Cache = field(default_factory=_Cache, repr=False, compare=False)

    # -- fitting ---------------------------------------------------------------------------

    def fit(self, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
        """Index real transitions, learn edits and templates, fit won/lost classifiers."""
        real = [t for t in trajectories if t.source == "real" and t.steps]
        if not real:
            raise ValueError("the grounded experience model needs real trajectories")
        edit_hits: dict[tuple[str, str], Counter] = defaultdict(Counter)
        feats, won, lost, games = [], [], [], []
        for traj in real:
            self.initial.setdefault(
                traj.task_id, (traj.initial_state, tuple(traj.steps[0].admissible_actions or ()))
            )
        for mem, s, was_lost in episode_rows(real):
            self._index(s, was_lost)
            verb, x, prep, y = parse_command(s.action)
            loc0, sur0, inv0 = split_state(s.state)
            loc1, sur1, inv1 = split_state(s.next_state)
            valid = bool(s.admissible_actions and s.action in s.admissible_actions)
            fb = s.next_state.rsplit("Feedback: ", 1)[-1] if "Feedback: " in s.next_state else ""
            if verb != "go":
                self.templates[(verb, prep, valid)][feedback_template(fb, x, y)] += 1
            if valid and verb != "go" and loc0 == loc1:
                for op in EDIT_OPERATORS:
                    edit_hits[(verb, prep)][op] += apply_edit(op, sur0, inv0, x, prep, y) == (
                        sur1,
                        inv1,
                    )
            feats.append(outcome_features(mem, s.action, s.admissible_actions or ()))
            won.append(int(s.reward == 1))
            lost.append(int(was_lost))
            games.append(s.task_id)
        self.edits = {k: c.most_common(1)[0][0] for k, c in edit_hits.items()}
        x_all = np.asarray(feats, np.float32)
        y_won, y_lost = np.asarray(won), np.asarray(lost)
        stats = self._fit_classifiers(x_all, y_won, y_lost, games)
        self.fit_stats = {
            "transitions": len(feats),
            "wins": int(y_won.sum()),
            "losses": int(y_lost.sum()),
            "games": len(set(games)),
            "edit_verbs": len(self.edits),
            "templates": sum(len(c) for c in self.templates.values()),
            **stats,
        }
        self._cache = _Cache()  # derived from the tables just built
        return self.fit_stats

    def _index(self, s: Transition, lost: bool) -> None:
        key = world_key(s.state)
        adm = tuple(s.admissible_actions or ())
        outcome = (s.next_state, s.reward, s.done and s.reward == 1, lost)
        self.exact[(s.task_id, key, s.action.lower())][outcome] += 1
        if adm:
            self.admissible_by_state[(s.task_id, key)] = adm
            loc, _, _ = split_state(s.state)
            self.states_by_room[(s.task_id, loc)].append((key, adm))
        verb, x, _, _ = parse_command(s.action)
        loc0, _, _ = split_state(s.state)
        loc1, sur1, _ = split_state(s.next_state)
        if verb == "go" and loc1 != loc0:
            self.exits[(s.task_id, loc0, x)][loc1] += 1
            self.room_views[(s.task_id, loc1)][sur1] += 1

    def _fit_classifiers(
        self, x: np.ndarray, y_won: np.ndarray, y_lost: np.ndarray, games: list[str]
    ) -> dict[str, Any]:
        # thresholds are chosen on held-out train games, then the models refit on all
        rng = random.Random(self.settings.seed)
        ids = sorted(set(games))
        held = set(rng.sample(ids, max(1, round(self.settings.threshold_holdout * len(ids)))))
        mask = np.array([g in held for g in games])
        out: dict[str, Any] = {}
        for name, y in (("won", y_won), ("lost", y_lost)):
            if y.sum() == 0:
                continue
            threshold, f1 = 0.5, 0.0
            if y[~mask].sum() and y[mask].sum():
                part = _LogisticRegression().fit(x[~mask], y[~mask])
                threshold, f1 = best_f1_threshold(part.proba(x[mask]), y[mask])
            model = _LogisticRegression().fit(x, y)
            setattr(self, f"{name}_model", model)
            setattr(self, f"{name}_threshold", threshold)
            out[f"{name}_threshold"] = threshold
            out[f"{name}_holdout_f1"] = f1
        return out

    # -- task variants (the curriculum's generator) ---------------------------------------

    def objects_of(self, task_id: str) -> list[tuple[str, str]]:
        """(object, where) pairs of portable things real data showed in this game."""
        views = [self.initial[task_id][0]] if task_id in self.initial else []
        views += [
            render_state(room, view, "", "")
            for (tid, room), counts in self.room_views.items()
            if tid == task_id
            for view in counts
        ]
        found: dict[str, str] = {}
        for state in views:
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
                            found.setdefault(name, where.format(holder))
        return sorted(found.items())

    def variants(self, seed: Task, n: int, iteration: int) -> list[str]:
        """Up to ``n`` new instructions in ``seed``'s game: an earlier step of a multi-step
        instruction as the goal, or another object this game holds as the thing to get."""
        rng = random.Random(f"{self.settings.seed}:{seed.task_id}:{iteration}")
        game = seed.parent_task_id if seed.generated and seed.parent_task_id else seed.task_id
        steps = instruction_steps(seed.instruction)
        options: list[str] = []
        if len(steps) > 1:
            options += [" ".join(steps[:j]) for j in range(1, len(steps))]
        target = seed.walkthrough[-1] if seed.walkthrough else ""
        for obj, where in self.objects_of(game):
            if obj.lower() not in target.lower():
                verb = rng.choice(("Retrieve", "Recover", "Pick up", "Take"))
                options.append(f"{verb} the {obj} from {where}.")
        rng.shuffle(options)
        return options[:n]

    # -- co-evolution ------------------------------------------------------------------------

    def add_synthetic(self, transitions: Iterable[Transition]) -> int:
        """Remember synthetic outcomes (later rounds replay them: a consistent dream)."""
        n = 0
        for s in transitions:
            key = (s.task_id, world_key(s.state), s.action.lower())
            if key in self.exact:
                continue
            self.synthetic[key][(s.next_state, s.reward, s.done and s.reward == 1, False)] += 1
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
        drafts = [self._draft(*q) for q in queries]
        pending = [d for d in drafts if d.memory is not None]
        if pending:
            feats = np.asarray(
                [outcome_features(d.memory, d.action, d.current) for d in pending], np.float32
            )
            for d, (won, lost, score) in zip(pending, self._classify_rows(feats), strict=True):
                d.decide(won, lost, score)
        return [d.outcome() for d in drafts]

    def _draft(
        self,
        task: Task,
        memory: EpisodeMemory,
        state: str,
        action: str,
        admissible: Sequence[str],
        rooms: dict[str, str] | None = None,
    ) -> _Draft:
        tid = task.task_id
        if not self.settings.history:
            memory = EpisodeMemory.replay(memory.instruction, state)
            rooms = None
        if self.settings.replay:
            key = (tid, _world_key(state), action.lower())
            for table, evidence in ((self.exact, REPLAY), (self.synthetic, SYNTHETIC_REPLAY)):
                if key in table:
                    ns, _, won, lost = _top(table[key])
                    adm, fallback = self._admissible(tid, ns, admissible)
                    why = "This command was seen in this state of this game: same outcome."
                    if evidence == SYNTHETIC_REPLAY:
                        why = "This command was dreamt in this state before: same outcome."
                    draft = _Draft(ns, bool(won), bool(lost), adm, evidence, fallback, why)
                    draft.score = float(bool(won))  # a recorded outcome is certain
                    if _is_generated(task):  # whether it is won is judged anew
                        draft.memory, draft.action, draft.current = memory, action, admissible
                    return draft
        location, surroundings, inventory = split_cached(state)
        verb, x, prep, y = _parse(action)
        valid = action in admissible
        nloc, nsur, ninv = location, surroundings, inventory
        evidence = EDIT
        if verb == "go" and valid:
            dests = self.exits.get((tid, location, x)) if self.settings.replay else None
            if dests:
                nloc = _top(dests)
                if rooms and nloc in rooms:
                    nsur = rooms[nloc]
                elif self.room_views.get((tid, nloc)):
                    nsur = _top(self.room_views[(tid, nloc)])
                evidence, why = MAP, f"Going {x} from the {location} leads to the {nloc}."
                feedback = f"You are in the {nloc}."
            elif (guess := self._guess_room(tid, location, x)) is not None:
                nloc = guess
                nsur = (rooms or {}).get(nloc) or _top(self.room_views[(tid, nloc)])
                evidence, why = MAP, f"The {nloc} has an unexplored exit back {OPPOSITE[x]}."
                feedback = f"You are in the {nloc}."
            else:
                evidence = UNKNOWN_ROOM
                why = f"Where going {x} from the {location} leads is unknown here."
                feedback = "You can't go that way."
        else:
            op = self.edits.get((verb, prep), "none") if valid else "none"
            if op != "none":
                nsur, ninv = _apply_edit(op, surroundings, inventory, x, prep, y)
            feedback = self._feedback(verb, prep, valid, x, y)
            why = (
                f"'{verb}' is {'admissible' if valid else 'not admissible'} here; "
                f"learned effect: {op.replace('_', ' ')}."
            )
        next_state = render_state(nloc, nsur, ninv, feedback)
        adm, fallback = self._admissible(tid, next_state, admissible)
        draft = _Draft(next_state, False, False, adm, evidence, fallback, why, replayed=False)
        draft.memory, draft.action, draft.current = memory, action, admissible
        return draft

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

    def _classify_rows(self, feats: np.ndarray) -> list[tuple[bool, bool, float]]:
        """(won, lost, won score) per feature row: each classifier called once."""
        n = len(feats)
        if self.won_model is not None:
            scores = self.won_model.proba(feats).astype(np.float64)
            won = scores >= self.won_threshold  # compared as Python floats (float64)
        else:
            scores, won = np.zeros(n), np.zeros(n, dtype=bool)
        lost = np.zeros(n, dtype=bool)
        if self.lost_model is not None:  # compared in float32, as a numpy scalar was
            lost = ~won & (self.lost_model.proba(feats) >= np.float32(self.lost_threshold))
        return [
            (bool(w), bool(lo), float(s))
            for w, lo, s in zip(won.tolist(), lost.tolist(), scores.tolist(), strict=True)
        ]

    def _admissible(
        self, task_id: str, next_state: str, current: Sequence[str]
    ) -> tuple[tuple[str, ...], bool]:
        key = (task_id, _world_key(next_state))
        recorded = self.admissible_by_state.get(key)
        if recorded:
            return recorded, False
        known = self._cache.admissible.get(key)
        if known is not None:
            return known
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

    def _room_candidates(
        self, task_id: str, location: str
    ) -> list[tuple[frozenset[str], tuple[str, ...]]]:
        """(words, admissible commands) of the recorded states of a room, first seen first."""
        key = (task_id, location)
        out = self._cache.rooms.get(key)
        if out is None:
            seen: set[tuple[str, tuple[str, ...]]] = set()
            out = []
            for state_key, adm in self.states_by_room.get(key) or ():
                if (state_key, adm) not in seen:  # a repeat never wins max() over the first
                    seen.add((state_key, adm))
                    out.append((frozenset(words(state_key)), adm))
            self._cache.rooms[key] = out
        return out

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


def _is_generated(task: Task) -> bool:
    return bool(task.generated)


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
