"""Fitting the grounded model on real transitions: its tables, edits, templates, classifiers."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from components.data.policies import EXPERT
from components.experience.grounded_outcome import (
    _LogisticRegression,
    best_f1_threshold,
    episode_rows,
    outcome_features,
    win_requirements,
)
from components.experience.grounded_page import (
    CLICK_OPS,
    click_op,
    page_edit,
    page_template,
    parse_action,
    parse_page,
    render_page,
)
from components.experience.grounded_science import (
    WinGate,
    WordPrior,
    is_science,
    next_gold,
    science_parse,
    unlisted_gold,
    win_conditions,
)
from components.experience.grounded_science_edits import SCIENCE_EDIT_OPERATORS, science_names
from components.experience.grounded_state import (
    EDIT_OPERATORS,
    apply_edit,
    feedback_template,
    parse_command,
    world_key,
)
from components.memory import split_state
from components.schema import Trajectory, Transition

PAGE_VERB = "page:"  # template keys of page verbs (apart from TextWorld's)

if TYPE_CHECKING:
    from components.experience.grounded import GroundedModel


def fit_tables(model: GroundedModel, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Index real transitions, learn edits and templates, fit won/lost classifiers.

    Fills ``model``'s tables and classifiers; returns the fit statistics.
    """
    real = [t for t in trajectories if t.source == "real" and t.steps]
    if not real:
        raise ValueError("the grounded experience model needs real trajectories")
    edit_hits: dict[tuple[str, str], Counter] = defaultdict(Counter)
    edit_seen: Counter = Counter()  # valid in-room commands per (verb, preposition)
    feats, won, lost, games = [], [], [], []
    page_hits = Counter()
    click_hits: dict[str, Counter] = defaultdict(Counter)  # per clicked kind, per CLICK_OPS
    for traj in real:
        model.initial.setdefault(
            traj.task_id, (traj.initial_state, tuple(traj.steps[0].admissible_actions or ()))
        )
    # a page env (MiniWoB++): page edits and the page's values as classifier features
    model.pages = all(parse_page(t.initial_state) is not None for t in real)
    # ScienceWorld: the focus / box / circuit relations and a word prior (out of fold)
    model.science = not model.pages and is_science(t.steps[0].instruction for t in real)
    prior = WordPrior()
    if model.science:
        wins = []
        for mem, s, was_lost in episode_rows(real):
            prior.add(s.task_id, s.instruction, s.action, s.reward == 1, was_lost)
            if s.reward == 1:
                wins.append((s.instruction, s.action, win_conditions(mem, s.state, s.action)))
        model.word_prior = prior.frozen()
        model.win_gate = WinGate.fit(wins)
        for t in real:
            if t.policy == EXPERT and t.success:
                model.gold_path.setdefault(t.task_id, tuple(s.action for s in t.steps))
    operators = EDIT_OPERATORS + (SCIENCE_EDIT_OPERATORS if model.science else ())
    # the env's list cap (ScienceWorld's max_admissible), as the data shows it
    cap = max((len(s.admissible_actions or ()) for t in real for s in t.steps), default=0)
    for mem, s, was_lost in episode_rows(real):
        listed = tuple(s.admissible_actions or ())
        if model.science:  # without the recording episode's next gold command (if capped)
            listed = unlisted_gold(
                listed, next_gold(model.gold_path.get(s.task_id, ()), mem.history), cap
            )
        _index(model, s, was_lost, listed, mem.last_action)
        feats.append(
            outcome_features(
                mem,
                s.action,
                s.admissible_actions or (),
                s.state if model.pages or model.science else None,
                prior.score(s.instruction, s.action, s.task_id) if model.science else None,
            )
        )
        won.append(int(s.reward == 1))
        lost.append(int(was_lost))
        games.append(s.task_id)
        if model.pages:
            _fit_page_step(model, s, page_hits, click_hits)
            ending = (s.done and s.reward == 1, was_lost)
            model.page_clicks.add(s.task_id, s.state, s.action, s.next_state, ending)
            continue
        verb, x, prep, y = (science_parse if model.science else parse_command)(s.action)
        loc0, sur0, inv0 = split_state(s.state)
        loc1, sur1, inv1 = split_state(s.next_state)
        valid = bool(s.admissible_actions and s.action in s.admissible_actions)
        fb = s.next_state.rsplit("Feedback: ", 1)[-1] if "Feedback: " in s.next_state else ""
        if verb != "go":  # ScienceWorld's feedback names the listed object ("glass cup")
            fx, fy = science_names(sur0, inv0, verb, x, y) if model.science else (x, y)
            model.templates[(verb, prep, valid)][feedback_template(fb, fx, fy)] += 1
        if valid and verb != "go" and loc0 == loc1:
            edit_seen[(verb, prep)] += 1
            for op in operators:
                edit_hits[(verb, prep)][op] += apply_edit(op, sur0, inv0, x, prep, y) == (
                    sur1,
                    inv1,
                )
    # ties go to the first operator: "none" before any edit
    model.edits = {k: c.most_common(1)[0][0] for k, c in edit_hits.items()}
    model.page_click_ops = {  # max keeps the first of a tie: "none"
        kind: op
        for kind, c in click_hits.items()
        if (op := max(CLICK_OPS, key=lambda o, c=c: c[o])) != "none"
    }
    x_all = np.asarray(feats, np.float32)
    y_won, y_lost = np.asarray(won), np.asarray(lost)
    stats = _fit_classifiers(model, x_all, y_won, y_lost, games)
    if not (model.pages or model.science):  # pages and ScienceWorld have their own gates
        model.win_requires = win_requirements(x_all, y_won)
        stats["win_requirements"] = len(model.win_requires)
    return {
        "transitions": len(feats),
        "wins": int(y_won.sum()),
        "losses": int(y_lost.sum()),
        "games": len(set(games)),
        "edit_verbs": len(model.edits),
        **edit_match(model.edits, edit_hits, edit_seen),
        "templates": sum(len(c) for c in model.templates.values()),
        **stats,
        **(
            {
                "page_edit_match": page_hits["match"] / max(1, page_hits["steps"]),
                "page_click_ops": dict(model.page_click_ops),
                "page_click_match": {
                    kind: round(c[model.page_click_ops.get(kind, "none")] / c["n"], 3)
                    for kind, c in sorted(click_hits.items())
                },
            }
            if model.pages
            else {}
        ),
    }


def edit_match(
    edits: dict[tuple[str, str], str], hits: dict[tuple[str, str], Counter], seen: Counter
) -> dict[str, Any]:
    """How often the learned edits reproduce the next state of a valid in-room command,
    beside "nothing changes" on the same commands; per verb where it has >= 20."""
    n = sum(seen.values())
    if not n:
        return {}
    by_verb = {
        " ".join(filter(None, k)): {
            "n": seen[k],
            "edit": edits[k],
            "match": round(hits[k][edits[k]] / seen[k], 3),
            "unchanged": round(hits[k]["none"] / seen[k], 3),
        }
        for k in sorted(seen, key=lambda k: (-seen[k], k))
        if seen[k] >= 20
    }
    return {
        "edit_match": round(sum(hits[k][e] for k, e in edits.items()) / n, 4),
        "edit_match_unchanged": round(sum(hits[k]["none"] for k in edits) / n, 4),
        "edit_match_by_verb": by_verb,
    }


def _fit_page_step(
    model: GroundedModel, s: Transition, hits: Counter, click_hits: dict[str, Counter]
) -> None:
    """Learn the feedback template of a page step; count whether ``page_edit`` matches it,
    and for a click, which of ``CLICK_OPS`` reproduces the page it left."""
    edited = page_edit(s.state, s.action)
    if edited is None:
        return
    page, verb, kind, valid = edited
    fb = s.next_state.rsplit("Feedback: ", 1)[-1] if "Feedback: " in s.next_state else ""
    model.templates[(PAGE_VERB + verb, kind, valid)][page_template(fb, s.action, kind)] += 1
    if s.done:  # a finished episode's page is the next episode's
        return
    after = world_key(s.next_state)
    hits["steps"] += 1
    hits["match"] += world_key(render_page(page, "")) == after
    if verb == "click" and valid and kind not in ("checkbox", "radio"):
        ref = parse_action(s.action).ref  # a valid click parses
        click_hits[kind]["n"] += 1
        for op in CLICK_OPS:
            click_hits[kind][op] += world_key(render_page(click_op(op, page, ref), "")) == after


def _index(
    model: GroundedModel, s: Transition, lost: bool, adm: tuple[str, ...], previous: str
) -> None:
    key = world_key(s.state)
    outcome = (s.next_state, s.reward, s.done and s.reward == 1, lost)
    model.exact[(s.task_id, key, s.action.lower())][outcome] += 1
    model.exact_after[(s.task_id, key, previous.lower(), s.action.lower())][outcome] += 1
    if model.science:  # its world changes with time: when each outcome was seen
        steps = model.outcome_steps.setdefault(
            (s.task_id, key, s.action.lower(), s.next_state), set()
        )
        steps.add(s.step_index + 1)
    if adm:
        model.admissible_by_state[(s.task_id, key)] = adm
        loc, _, _ = split_state(s.state)
        model.states_by_room[(s.task_id, loc)].append((key, adm))
    verb, x, _, _ = (science_parse if model.science else parse_command)(s.action)
    loc0, _, _ = split_state(s.state)
    loc1, sur1, _ = split_state(s.next_state)
    if verb == "go" and loc1 != loc0:
        model.exits[(s.task_id, loc0, x)][loc1] += 1
        model.room_views[(s.task_id, loc1)][sur1] += 1
        if model.science:
            view = model.room_view_steps.setdefault((s.task_id, loc1, sur1), set())
            view.add(s.step_index + 1)


def _fit_classifiers(
    model: GroundedModel, x: np.ndarray, y_won: np.ndarray, y_lost: np.ndarray, games: list[str]
) -> dict[str, Any]:
    # thresholds are chosen on held-out train games, then the models refit on all
    rng = random.Random(model.settings.seed)
    ids = sorted(set(games))
    held = set(rng.sample(ids, max(1, round(model.settings.threshold_holdout * len(ids)))))
    mask = np.array([g in held for g in games])
    out: dict[str, Any] = {}
    for name, y in (("won", y_won), ("lost", y_lost)):
        if y.sum() == 0:
            continue
        threshold, f1 = 0.5, 0.0
        if y[~mask].sum() and y[mask].sum():
            part = _LogisticRegression().fit(x[~mask], y[~mask])
            threshold, f1 = best_f1_threshold(part.proba(x[mask]), y[mask])
        lr = _LogisticRegression().fit(x, y)
        setattr(model, f"{name}_model", lr)
        setattr(model, f"{name}_threshold", threshold)
        out[f"{name}_threshold"] = threshold
        out[f"{name}_holdout_f1"] = f1
    return out
