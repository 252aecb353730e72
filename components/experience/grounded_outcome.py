"""What the grounded model answers, and how it decides reward and termination.

``Outcome`` is one predicted step, ``Query`` one question, ``_Draft`` an answer from the
tables before the classifiers decide. Reward and termination come from two class-balanced
logistic regressions (won, lost) on ``outcome_features`` of the command against the
instruction's steps and the episode's instruction pointer; ``best_f1_threshold`` chooses
their thresholds on held-out games. ``episode_rows`` gives their training rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from components.experience.grounded_page import last_click, page_features
from components.experience.grounded_science import science_features
from components.experience.grounded_state import _content
from components.memory import (
    EXACT,
    NAMESAKE,
    VERB_WORDS,
    VERBS,
    EpisodeMemory,
    content_words,
    naming,
    object_phrases,
    verb_in,
    verb_of,
)
from components.schema import Task, Trajectory, Transition


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
    state: str = ""
    # a ScienceWorld focus judged as the move it mirrors (grounded_science.focus_as_move)
    mirror: tuple[EpisodeMemory, str] | None = None
    mirror_won: tuple[bool, float] | None = None

    def decide(self, won: bool, lost: bool, score: float) -> None:
        self.won, self.lost = won, lost
        if self.replayed:  # the recorded next state, the reward anew
            self.why += " Whether it is won is judged anew for this episode."
            self.score = score
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


# -- reward / termination classifier -------------------------------------------------------


def outcome_features(
    mem: EpisodeMemory,
    command: str,
    admissible: Sequence[str],
    state: str | None = None,
    science_prior: Sequence[float] | None = None,
) -> list[float]:
    """Features of (instruction steps, pointer, command) for the won / lost classifiers.

    With ``state`` (a page env's models), ``page_features`` of it are appended; with
    ``science_prior`` (a ScienceWorld model's word prior of the command), ``science_features``.
    """
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
    page = []
    if science_prior is not None:
        page = science_features(mem, state or "", command, science_prior)
    elif state is not None:
        page = page_features(mem.instruction, state, command, last_click(mem.history))
    final = mem.steps[-1] if mem.steps else ""
    return [
        *_final_step_features(final, command),  # first: FINAL_STEP_COLUMNS
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
        *page,
    ]


FINAL_STEP_COLUMNS = (0, 1, 2, 3)  # outcome_features' columns of _final_step_features


def win_requirements(x: np.ndarray, y_won: np.ndarray, min_wins: int = 10) -> dict[int, float]:
    """The final-step features every real win had one value of: {column: value}.

    A text game's linear won classifier never saw ``drop sponge`` for "place the sponge
    into the box" in real data (no one played it there), so it cannot learn that the
    destination conflict forbids a win; RL finds such commands at once. As ScienceWorld's
    ``WinGate``: a predicted win also needs what every real win had.
    """
    wins = x[y_won == 1]
    if len(wins) < min_wins:
        return {}
    return {j: float(wins[0, j]) for j in FINAL_STEP_COLUMNS if np.all(wins[:, j] == wins[0, j])}


def meets(feats: np.ndarray, requires: dict[int, float]) -> np.ndarray:
    """Per feature row: whether it has every required value (``win_requirements``)."""
    ok = np.ones(len(feats), dtype=bool)
    for j, v in requires.items():
        ok &= feats[:, j] == np.float32(v)
    return ok


def _final_step_features(final: str, command: str) -> tuple[float, float, float, float]:
    """How ``command`` meets the last step sentence beyond shared words (text games).

    What RL finds where word overlap is blind: ``drop sponge`` for "place the sponge into
    the box" ("place" is a word for drop too), ``open box`` for "the vanilla scented box is
    open" (a namesake), ``close locker`` for "If you have shut the locker, lock it" (the
    last clause's verb is the step's). Every real final command of 440 train and selection
    games has the last clause's verb, names its things exactly and agrees on where.
    """
    phrases = object_phrases(command.split(" with ", 1)[0])  # a lock's key aside
    if not phrases or not final:
        return (0.0, 0.0, 0.0, 0.0)
    verb, n = verb_of(command), len(phrases)
    named = [naming(p, final) for p in phrases]
    if verb == "drop":
        conflict = "floor" not in content_words(final)
    elif verb in ("put", "insert"):
        conflict = len(phrases) < 2 or named[-1] != EXACT
    else:
        conflict = False
    return (
        verb_in(command, content_words(final.rsplit(",", 1)[-1])),
        sum(k == EXACT for k in named) / n,
        sum(k == NAMESAKE for k in named) / n,
        float(conflict),
    )


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
        for step, lost in steps_lost(traj):
            yield mem, step, lost
            mem.update(step.action, step.next_state)


def steps_lost(traj: Trajectory) -> Iterable[tuple[Transition, bool]]:
    """Each step of ``traj`` with whether it lost the game: the episode ended there
    without the reward and not by the step limit."""
    last = len(traj.steps) - 1
    for i, step in enumerate(traj.steps):
        yield step, i == last and not traj.success and not traj.truncated and step.done
