"""The synthetic environment of the grounded experience model (cpu profile).

Same vector contract as ``VectorSyntheticEnv`` (components/experience/synthetic_env.py):
``reset(tasks)``, ``step(actions)`` with ``None`` for finished slots, ``active``,
``trajectories(...)`` and ``metrics()``; the RL loop cannot tell it from a real env list,
except that it counts no real step. Each slot keeps what a consistent dream needs: the
episode's memory (its instruction pointer), how it last saw every room, the steps so far.

A synthetic step answers with the model's next state, reward, ``won``/``lost`` and the
admissible commands of the next state (``info``), exactly the real env's contract, so the
scoring policy runs in it unchanged. Evidence counts (replayed, map, edit, unknown room,
admissible fallbacks) are reported by ``metrics``. Known tasks start from their recorded
first state; a generated task (curriculum variant) from its parent's.

A step call predicts all its live episodes as one batch (``GroundedModel.predict_batch``:
the won/lost classifiers run once per call), with exactly the outcomes that stepping the
episodes one at a time gives. ``restart_finished()`` keeps a batch full (throughput runs).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from components.envs.episodic import normalize_command
from components.experience.grounded import (
    GroundedModel,
    Outcome,
    Query,
    split_cached,
)
from components.experience.grounded_drafts import EVIDENCE_KINDS
from components.experience.synthetic_episodes import (
    EpisodeRecord,
    EpisodeSlots,
    StepOutput,
    episode_transition,
    feedback_of,
    step_info,
)
from components.memory import EpisodeMemory
from components.schema import Provenance, Task, Transition

EVIDENCE = "evidence"  # extra info key: what decided the step (replay, map, edit, ...)
_PROVENANCE = Provenance(policy="synthetic")  # frozen: one shared instance
_EVIDENCE_KEYS = {e: f"evidence_{e}" for e in EVIDENCE_KINDS}
_feedback_of = lru_cache(maxsize=1 << 14)(feedback_of)  # states repeat across episodes


@dataclass(kw_only=True)
class _Slot(EpisodeRecord):
    """One slot's episode, with what a consistent dream needs (memory, rooms as last seen)."""

    admissible: tuple[str, ...]
    memory: EpisodeMemory
    rooms: dict[str, str] = field(default_factory=dict)


class GroundedVectorEnv(EpisodeSlots[_Slot]):
    """Many synthetic episodes of the grounded model stepped together."""

    def __init__(
        self,
        model: GroundedModel,
        *,
        max_steps: int,
        env_name: str = "textworld",
        namespace: str = "synthetic",
        initial_states: dict[str, tuple[str, tuple[str, ...]]] | None = None,
    ) -> None:
        super().__init__(env_name, namespace)
        self.model = model
        # first states of games the model has no real episode of (judging unseen games)
        self.initial_states = dict(initial_states or {})
        self.max_steps = max_steps
        self._seconds = 0.0

    def start_state(self, task: Task) -> tuple[str, tuple[str, ...]]:
        """The first state of ``task``: recorded, or its parent's for a generated task."""
        for tid in (task.task_id, task.parent_task_id):
            if tid is None:
                continue
            start = self.initial_states.get(tid) or self.model.initial_state(tid)
            if start is not None:
                return start
        raise KeyError(
            f"no recorded initial state for task {task.task_id!r} (nor its parent "
            f"{task.parent_task_id!r}): the grounded model only simulates games it has real "
            "episodes of"
        )

    def reset(
        self, tasks: Sequence[Task], seed: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Start one episode per task (repeat a task for a group)."""
        self._new_batch(tasks, seed)
        self._slots = []
        out = []
        for task in tasks:
            slot = self._start(task)
            self._slots.append(slot)
            out.append((slot.state, self._info(slot, None, valid=True)))
        return out

    def restart_finished(self, keep: bool = True) -> dict[int, tuple[str, dict[str, Any]]]:
        """Start a new episode of the same task in every finished slot (keeps the batch full).

        The finished episodes stay available to ``trajectories()`` (first), or with
        ``keep=False`` are dropped. For continuous rollouts and throughput measurements;
        GRPO groups simply run a batch to the end.
        """
        out = {}
        for i, slot in enumerate(self._slots):
            if slot.finished:
                if keep:
                    self._archive.append(slot)
                self._slots[i] = self._start(slot.task)
                out[i] = (self._slots[i].state, self._info(self._slots[i], None, valid=True))
        return out

    def _start(self, task: Task) -> _Slot:
        state, admissible = self.start_state(task)
        key = self._episode_key(task)
        memory = EpisodeMemory.replay(task.instruction, state)
        location, surroundings, _ = split_cached(state)
        rooms = {location: surroundings}
        return _Slot(key, task, state, state, admissible=admissible, memory=memory, rooms=rooms)

    def step(self, actions: Sequence[str | None]) -> list[StepOutput | None]:
        """Advance every live episode by its action; finished slots return None.

        The live episodes are predicted as one batch (``GroundedModel.predict_batch``:
        each classifier runs once per call), then recorded one by one.
        """
        if len(actions) != len(self._slots):
            raise ValueError(f"{len(actions)} actions for {len(self._slots)} episodes")
        start = time.perf_counter()
        out: list[StepOutput | None] = [None] * len(self._slots)
        live = [
            (i, slot, _as_listed(action, slot.admissible))
            for i, (slot, action) in enumerate(zip(self._slots, actions, strict=True))
            if not (slot.finished or action is None)
        ]
        outcomes = self.model.predict_batch(
            [
                Query(slot.task, slot.memory, slot.state, action, slot.admissible, slot.rooms)
                for _, slot, action in live
            ]
        )
        for (i, slot, action), o in zip(live, outcomes, strict=True):
            out[i] = self._advance(slot, action, o)
        self._seconds += time.perf_counter() - start
        return out

    def _advance(self, slot: _Slot, action: str, o: Outcome) -> StepOutput:
        valid = action in slot.admissible
        terminated = o.won or o.lost
        truncated = not terminated and len(slot.steps) + 1 >= self.max_steps
        slot.steps.append(self._transition(slot, action, o, terminated or truncated, valid))
        slot.reasoning.append(o.reasoning)
        slot.memory.update(action, o.next_state)
        location, surroundings, _ = split_cached(o.next_state)
        slot.rooms[location] = surroundings
        slot.state, slot.admissible = o.next_state, o.admissible
        self._counts["steps"] += 1
        self._counts[_EVIDENCE_KEYS.get(o.evidence) or f"evidence_{o.evidence}"] += 1
        self._counts["admissible_fallbacks"] += o.admissible_fallback
        if terminated or truncated:
            slot.finished = True
            slot.success = o.won
            slot.truncated = truncated
            self._counts["successes"] += o.won
            self._counts["losses"] += o.lost
        info = self._info(slot, o.reasoning, valid=valid, evidence=o.evidence, lost=o.lost)
        return StepOutput(o.next_state, o.reward, terminated, truncated, info)

    def _transition(
        self, slot: _Slot, action: str, o: Outcome, done: bool, valid: bool
    ) -> Transition:
        return episode_transition(
            slot,
            # a provisional id: trajectories() gives every step its final one (content hash)
            f"{slot.key}-{len(slot.steps)}",
            env=self.name,
            action=action,
            next_state=o.next_state,
            reward=o.reward,
            done=done,
            admissible_actions=list(slot.admissible),
            valid_action=valid,
            provenance=_PROVENANCE,  # validated, not copied (model_construct is slower)
        )

    def _info(
        self,
        slot: _Slot,
        reasoning: str | None,
        *,
        valid: bool,
        evidence: str | None = None,
        lost: bool = False,
    ) -> dict[str, Any]:
        return step_info(
            None if slot.finished else list(slot.admissible),
            valid=valid,
            won=slot.success,
            lost=lost,
            feedback=_feedback_of(slot.state),
            reasoning=reasoning,
            malformed=False,
            **{EVIDENCE: evidence},
        )

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """Steps, steps/s, evidence counts, admissible fallbacks, successes and losses."""
        out = {k: float(v) for k, v in self._counts.items()}
        out.setdefault("steps", 0.0)
        out["seconds_step"] = round(self._seconds, 4)
        out["steps_per_s"] = round(out["steps"] / self._seconds, 2) if self._seconds else 0.0
        steps = max(out["steps"], 1.0)
        out["replay_share"] = round(out.get("evidence_replay", 0.0) / steps, 4)
        out["admissible_fallback_share"] = round(out.get("admissible_fallbacks", 0.0) / steps, 4)
        out["malformed_rate"] = 0.0  # the grounded model always answers in format
        if reset:
            self._counts.clear()
            self._seconds = 0.0
        return out


def _as_listed(action: str, admissible: Sequence[str]) -> str:
    """The listed command ``action`` means: the real envs compare commands in lower case
    with single spaces, so "Take  cup" is "take cup" (the model's tables know only that)."""
    if action in admissible:
        return action
    norm = normalize_command(action)
    return next((a for a in admissible if normalize_command(a) == norm), action)
