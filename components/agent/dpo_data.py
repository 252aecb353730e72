"""Preference pairs for the DPO baseline, built from offline real train trajectories.

Construction (deterministic, train split only):

1. Every step of every real train trajectory is a *visit* of a state key: the exact
   prompt the policy sees there (task, last ``history_len`` (action, feedback) steps,
   state, admissible actions). Trajectories of one task share keys wherever they pass
   through the same state with the same recent history (always at the first step).
2. At each key the **chosen** action is the one with the fewest steps left to success
   among visits from successful trajectories whose action was admissible (ties: the
   expert's, then alphabetical). Keys that no successful trajectory visits yield no pair.
3. **Rejected** actions at that key are the other actions seen there that are
   ``invalid`` (inadmissible), ``failed_continuation`` (taken there only by trajectories
   that then failed), or ``no_progress`` (changed nothing but the feedback, and never
   led to success faster than the chosen action). Actions that made progress in a
   successful trajectory are never rejected: a detour that still wins is not clearly
   worse.
4. At most ``max_rejected_per_state`` rejected actions per key (invalid first, then
   failed continuations, then no progress; alphabetical within a reason). Pairs are
   unique per (prompt, chosen, rejected) by construction.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from components.agent.policy import PolicySettings, render_prompt
from components.agent.sft_data import TRAIN_SPLIT, answer_for, observation_at, state_core
from components.experience.format import ChatPrompt, assistant_turn
from components.schema import Trajectory, stable_id

INVALID = "invalid"
FAILED_CONTINUATION = "failed_continuation"
NO_PROGRESS = "no_progress"
REASONS = (INVALID, FAILED_CONTINUATION, NO_PROGRESS)  # priority order when capping
EXPERT = "expert"


@dataclass
class _Visit:
    """What happened when one trajectory took ``action`` at a key."""

    action: str
    valid: bool
    progress: bool  # the state changed beyond the feedback, or the task was won
    success: bool  # the trajectory went on to succeed
    steps_to_go: int  # steps from this one to the end of the trajectory, inclusive
    policy: str


@dataclass
class _Key:
    """All visits of one prompt."""

    messages: tuple[dict[str, str], ...]
    admissible: tuple[str, ...] | None
    task_id: str
    visits: list[_Visit] = field(default_factory=list)


@dataclass(frozen=True)
class PreferencePair(ChatPrompt):
    """One DPO example: the same prompt, a preferred and a rejected answer."""

    id: str
    task_id: str
    messages: tuple[dict[str, str], ...]  # system + user
    chosen_action: str
    rejected_action: str
    chosen: str  # rendered answers
    rejected: str
    reason: str  # why the rejected action is worse (one of REASONS)

    def to_dpo(self) -> dict[str, Any]:
        """The conversational prompt/chosen/rejected record TRL's DPOTrainer trains on."""
        return {
            "prompt": self.prompt(),
            "chosen": assistant_turn(self.chosen),
            "rejected": assistant_turn(self.rejected),
        }


def collect_keys(trajectories: Iterable[Trajectory], settings: PolicySettings) -> dict[str, _Key]:
    """Every visited prompt of the real train trajectories, with its visits."""
    keys: dict[str, _Key] = {}
    for traj in trajectories:
        if traj.split != TRAIN_SPLIT or traj.source != "real":
            continue
        n = traj.n_steps
        for i, step in enumerate(traj.steps):
            obs = observation_at(traj, i, settings)
            messages = tuple(render_prompt(obs, settings))
            blob = json.dumps(messages, sort_keys=True)
            key = keys.setdefault(blob, _Key(messages, obs.admissible, traj.task_id))
            progress = bool(step.reward) or state_core(step.next_state) != state_core(step.state)
            key.visits.append(
                _Visit(
                    action=step.action,
                    valid=step.valid_action,
                    progress=progress,
                    success=traj.success,
                    steps_to_go=n - i,
                    policy=traj.policy,
                )
            )
    return keys


def choose(visits: list[_Visit]) -> _Visit | None:
    """The preferred visit: admissible, in a successful trajectory, fewest steps to go."""
    good = [v for v in visits if v.success and v.valid]
    if not good:
        return None
    return min(good, key=lambda v: (v.steps_to_go, v.policy != EXPERT, v.action))


def rejected_actions(visits: list[_Visit], chosen: _Visit) -> list[tuple[str, str]]:
    """(action, reason) for every action at the key that is worse than the chosen one."""
    by_action: dict[str, list[_Visit]] = defaultdict(list)
    for v in visits:
        by_action[v.action].append(v)
    out: list[tuple[str, str]] = []
    for action, vs in by_action.items():
        if action == chosen.action:
            continue
        if any(not v.valid for v in vs):
            out.append((action, INVALID))
        elif not any(v.success for v in vs):
            out.append((action, FAILED_CONTINUATION))
        elif not any(v.progress for v in vs) and all(
            v.steps_to_go > chosen.steps_to_go for v in vs if v.success
        ):
            out.append((action, NO_PROGRESS))
    out.sort(key=lambda ar: (REASONS.index(ar[1]), ar[0]))
    return out


def build_pairs(
    trajectories: Iterable[Trajectory],
    settings: PolicySettings,
    *,
    max_rejected_per_state: int = 3,
    limit: int | None = None,
    seed: int = 0,
) -> tuple[list[PreferencePair], dict[str, int]]:
    """Preference pairs (see the module docstring) and counts of how they were built."""
    keys = collect_keys(trajectories, settings)
    pairs: list[PreferencePair] = []
    reasons: Counter[str] = Counter()
    with_chosen = with_pair = 0
    for key in keys.values():
        chosen = choose(key.visits)
        if chosen is None:
            continue
        with_chosen += 1
        rejected = rejected_actions(key.visits, chosen)[:max_rejected_per_state]
        with_pair += bool(rejected)
        chosen_answer = answer_for(chosen.action, key.admissible, settings)
        for action, reason in rejected:
            reasons[reason] += 1
            pairs.append(
                PreferencePair(
                    id=stable_id("dpo", json.dumps(key.messages), chosen.action, action),
                    task_id=key.task_id,
                    messages=key.messages,
                    chosen_action=chosen.action,
                    rejected_action=action,
                    chosen=chosen_answer,
                    rejected=answer_for(action, key.admissible, settings),
                    reason=reason,
                )
            )
    stats = {
        "states": len(keys),
        "states_with_chosen": with_chosen,
        "states_with_pairs": with_pair,
        "pairs_total": len(pairs),
        **{f"pairs_{r}": reasons[r] for r in REASONS},
    }
    if limit is not None and limit < len(pairs):
        pairs = random.Random(seed).sample(pairs, limit)
    stats["pairs"] = len(pairs)
    return pairs, stats
