"""Episode bookkeeping of the synthetic envs (``VectorSyntheticEnv``, ``GroundedVectorEnv``).

What a step returns (``StepOutput``, the extra info keys), the state text helpers, where
an LLM env's episodes start and which actions they offer (``RealStateIndex``, from real
data), the per-slot episode record, the slots of a batch (restarted episodes archived)
and the finished episodes as Trajectory records with final ids (``stamp_trajectory``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON
from components.schema import Provenance, Task, Trajectory, Transition, stable_id

# extra info keys of the synthetic env (the shared ones live in components/envs/base.py)
REASONING = "reasoning"  # str | None: the experience model's reasoning for this step
MALFORMED = "malformed"  # bool: the episode ended because the model's answer was malformed
RESAMPLED = "resampled"  # bool: this step's answer needed the one resample
SYNTHETIC = "synthetic"  # bool: always True here (real envs never set it)

FEEDBACK_PREFIX = "Feedback:"  # the last line of a TextWorld abstract state
_WS = re.compile(r"\s+")


def step_info(
    admissible: list[str] | None,
    *,
    valid: bool,
    won: bool,
    lost: bool,
    feedback: str,
    reasoning: str | None,
    malformed: bool,
    **extra: Any,
) -> dict[str, Any]:
    """The info of a synthetic env's step: the shared keys, ``synthetic`` and ``extra``."""
    return {
        ADMISSIBLE: admissible,
        VALID: valid,
        WON: won,
        LOST: lost,
        FEEDBACK: feedback,
        REASONING: reasoning,
        MALFORMED: malformed,
        SYNTHETIC: True,
        **extra,
    }


class StepOutput(NamedTuple):
    """One episode's step result; unpacks like the Gymnasium 5-tuple."""

    observation: str
    reward: int
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip()


def world_key(state: str) -> str:
    """The state without its feedback line, whitespace-normalised (admissible-action key)."""
    lines = [ln for ln in state.splitlines() if not ln.strip().startswith(FEEDBACK_PREFIX)]
    return _norm("\n".join(lines))


def feedback_of(state: str) -> str:
    """The ``Feedback:`` line's text of a state, or the whole state when it has none."""
    for ln in reversed(state.splitlines()):
        if ln.strip().startswith(FEEDBACK_PREFIX):
            return ln.strip()[len(FEEDBACK_PREFIX) :].strip()
    return _norm(state)


@dataclass(frozen=True)
class RealStateIndex:
    """What the synthetic env takes from real data: initial states and admissible actions."""

    initial_states: Mapping[str, str] = field(default_factory=dict)  # task_id -> state
    # (task_id, world key) and ("", world key) -> admissible actions of a real transition
    admissible_by_state: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_trajectories(cls, trajectories: Iterable[Trajectory]) -> RealStateIndex:
        """Index the real trajectories' initial states and admissible actions."""
        initial: dict[str, str] = {}
        admissible: dict[tuple[str, str], tuple[str, ...]] = {}
        for traj in trajectories:
            if traj.source != "real":
                continue
            initial.setdefault(traj.task_id, traj.initial_state)
            for s in traj.steps:
                if s.admissible_actions:
                    key = world_key(s.state)
                    acts = tuple(s.admissible_actions)
                    admissible.setdefault((s.task_id, key), acts)
                    admissible.setdefault(("", key), acts)
        return cls(initial, admissible)

    def initial_state(self, task_id: str) -> str | None:
        """The real initial observation of a known task."""
        return self.initial_states.get(task_id)

    def admissible(self, task_id: str, state: str) -> list[str] | None:
        """Admissible actions recorded at this world state (same task first), else None."""
        key = world_key(state)
        acts = self.admissible_by_state.get((task_id, key)) or self.admissible_by_state.get(
            ("", key)
        )
        return list(acts) if acts else None


@dataclass
class EpisodeRecord:
    """Mutable state of one slot: what every synthetic env records of its episode."""

    key: str  # internal episode id (retrieval exclusion, stamping)
    task: Task
    initial_state: str
    state: str
    steps: list[Transition] = field(default_factory=list)
    reasoning: list[str | None] = field(default_factory=list)
    finished: bool = False
    success: bool = False
    truncated: bool = False


def episode_transition(
    ep: EpisodeRecord,
    transition_id: str,
    *,
    env: str,
    action: str,
    next_state: str,
    reward: int,
    done: bool,
    **fields: Any,
) -> Transition:
    """``ep``'s next step (from its current state) as a synthetic Transition record."""
    return Transition(
        id=transition_id,
        task_id=ep.task.task_id,
        env=env,
        episode_id=ep.key,
        step_index=len(ep.steps),
        instruction=ep.task.instruction,
        state=ep.state,
        action=action,
        next_state=next_state,
        reward=reward,
        done=done,
        source="synthetic",
        **fields,
    )


def stamp_trajectory(
    ep: Any,
    *,
    namespace: str,
    env: str,
    policy: str,
    iteration: int,
    checkpoint: str | None,
    split: str = "train",
) -> Trajectory:
    """A finished synthetic episode as a Trajectory with final ids and provenance.

    ``ep`` has ``key``, ``task``, ``initial_state``, ``steps``, ``success``, ``truncated``.
    The content hash keeps ids distinct across env instances that share a namespace.
    """
    content = stable_id(*(f"{t.action}\x1e{t.next_state}" for t in ep.steps))
    episode_id = stable_id(namespace, iteration, checkpoint, policy, ep.key, content)
    prov = Provenance(policy=policy, iteration=iteration, checkpoint=checkpoint)
    steps = [
        s.model_copy(
            update={
                "id": Transition.make_id(episode_id, s.step_index),
                "episode_id": episode_id,
                "provenance": prov,
            }
        )
        for s in ep.steps
    ]
    return Trajectory(
        episode_id=episode_id,
        task_id=ep.task.task_id,
        env=env,
        split=split,  # type: ignore[arg-type]
        source="synthetic",
        policy=policy,
        initial_state=ep.initial_state,
        steps=steps,
        success=ep.success,
        truncated=ep.truncated,
    )


E = TypeVar("E", bound=EpisodeRecord)


class EpisodeSlots(Generic[E]):
    """The slots of a batch of synthetic episodes (the env's ``reset``/``step`` fill them).

    With ``reset``/``step``/``close`` a subclass is a ``VectorEnv`` (components/envs/vector.py).
    """

    real_steps = 0  # a synthetic env never touches a real one

    def close(self) -> None:
        """Nothing to release (the model belongs to the caller)."""

    def __init__(self, env_name: str, namespace: str) -> None:
        self.name = env_name
        self.namespace = namespace
        self._slots: list[E] = []
        self._archive: list[E] = []  # finished episodes of restarted slots
        self._started = 0  # episodes started by this env (part of every episode key)
        self._seed: int | None = None
        self._counts: Counter[str] = Counter()

    def _new_batch(self, tasks: Sequence[Task], seed: int | None) -> None:
        """The start of ``reset``: a batch needs tasks; the last batch's archive goes."""
        if not tasks:
            raise ValueError("reset needs at least one task")
        self._seed = seed
        self._archive = []

    def _episode_key(self, task: Task) -> str:
        """The internal id of a new episode of ``task`` (counted as started)."""
        self._started += 1
        self._counts["episodes"] += 1
        return stable_id(self.namespace, self._seed, self._started, task.task_id)

    def state_dict(self) -> dict[str, Any]:
        """What the next episode keys depend on: episodes started so far (a resumed run
        restores it, so its episodes get the ids an uninterrupted run's get)."""
        return {"episodes_started": self._started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict`` (before the next ``reset``)."""
        self._started = int(state["episodes_started"])

    @property
    def num_envs(self) -> int:
        """Slots of the current batch."""
        return len(self._slots)

    @property
    def active(self) -> list[bool]:
        """Per slot: the episode is still running."""
        return [not e.finished for e in self._slots]

    @property
    def done(self) -> bool:
        """Every episode of the batch has finished."""
        return all(e.finished for e in self._slots)

    def trajectories(
        self,
        *,
        policy: str,
        iteration: int = 0,
        checkpoint: str | None = None,
        split: str = "train",
        include_empty: bool = False,
    ) -> list[Trajectory]:
        """The batch's episodes (restarted ones first) as synthetic Trajectory records."""
        return [
            stamp_trajectory(
                ep,
                namespace=self.namespace,
                env=self.name,
                policy=policy,
                iteration=iteration,
                checkpoint=checkpoint,
                split=split,
            )
            for ep in [*self._archive, *self._slots]
            if ep.steps or include_empty
        ]

    def episode_reasoning(self) -> list[list[str | None]]:
        """Per slot, the model's reasoning for each recorded step (for judging)."""
        return [list(e.reasoning) for e in self._slots]
