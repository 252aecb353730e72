"""The batched env contract (``VectorEnv``) and ``EnvList``, plain ``Env``s behind it.

RL rollouts (components/agent/rollout.py) drive every env through ``VectorEnv``: a list
of real games (``EnvList``, which counts every real step it takes) and the synthetic
envs of components/experience alike. A single ``Env`` (components/envs/base.py) is not a
``VectorEnv``: it has no ``active``/``done``/``real_steps``, so ``isinstance`` tells the two
apart. ``CappedEnvList`` is an ``EnvList`` with a hard real-step budget (sim-to-real).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from components.envs.base import Env, EnvError
from components.schema import Task

ENV_ERROR = "env_error"  # info key: the env process failed, the episode ended as a failure
StepTuple = tuple[str, float, bool, bool, dict[str, Any]]
BUDGET_CUT = "real-step budget spent"  # ENV_ERROR of episodes cut by CappedEnvList


@runtime_checkable
class VectorEnv(Protocol):
    """Many episodes stepped together: the one batched contract of real and synthetic envs.

    ``reset(tasks)`` starts one slot per task and returns its ``(observation, info)``;
    ``step(actions)`` takes one action per slot (``None`` for a finished slot, which
    returns ``None``) and returns ``(obs, reward, terminated, truncated, info)`` per live
    slot. ``active`` is each slot's "still running", ``done`` is "every slot finished",
    ``real_steps`` counts real env interactions (0 for the synthetic envs), ``close``
    releases what the env owns. Implemented by ``EnvList`` (below, plain ``Env``s),
    ``GroundedVectorEnv`` and ``VectorSyntheticEnv`` (components/experience).
    """

    real_steps: int

    def reset(self, tasks: Sequence[Task]) -> list[tuple[str, dict[str, Any]]]:
        """Start one episode per task."""
        ...

    def step(self, actions: Sequence[str | None]) -> Sequence[StepTuple | None]:
        """One action per slot (None for finished slots)."""
        ...

    @property
    def active(self) -> list[bool]:
        """Per slot: the episode is still running."""
        ...

    @property
    def done(self) -> bool:
        """Every episode has finished."""
        ...

    def close(self) -> None:
        """Release what the env owns."""
        ...


class EnvList:
    """Plain ``Env`` instances behind the vector interface; counts real steps.

    Slots get an env that last ran the same task when one is free (TextWorld keeps the
    game loaded), else any free env; missing envs come from ``factory``. An ``EnvError``
    ends that episode as a failure (reward 0, terminated, ``info[ENV_ERROR]``); the step
    that raised still counts as a real interaction.
    """

    def __init__(
        self,
        envs: Sequence[Env] = (),
        factory: Callable[[], Env] | None = None,
        *,
        real: bool = True,
    ) -> None:
        if not envs and factory is None:
            raise ValueError("EnvList needs envs or a factory")
        self.envs: list[Env] = list(envs)
        self.factory = factory
        self.real = real  # False for a list of synthetic single envs (no real steps counted)
        self.real_steps = 0
        self.real_resets = 0
        self._last_task: list[str | None] = [None] * len(self.envs)
        self._slots: list[int] = []  # slot -> env index
        self._live: list[bool] = []

    @property
    def active(self) -> list[bool]:
        """Per slot: the episode is still running."""
        return list(self._live)

    @property
    def done(self) -> bool:
        """Every episode has finished."""
        return not any(self._live)

    def _assign(self, tasks: Sequence[Task]) -> list[int]:
        while len(self.envs) < len(tasks):
            if self.factory is None:
                raise ValueError(f"{len(tasks)} tasks but only {len(self.envs)} envs")
            self.envs.append(self.factory())
            self._last_task.append(None)
        free = set(range(len(self.envs)))
        slots: list[int | None] = [None] * len(tasks)
        for s, task in enumerate(tasks):  # prefer an env that already has this game loaded
            match = next((e for e in sorted(free) if self._last_task[e] == task.task_id), None)
            if match is not None:
                slots[s] = match
                free.discard(match)
        for s in range(len(tasks)):
            if slots[s] is None:
                slots[s] = min(free)
                free.discard(slots[s])
        return [int(e) for e in slots if e is not None]

    def reset(self, tasks: Sequence[Task]) -> list[tuple[str, dict[str, Any]]]:
        """Reset one env per task."""
        self._slots = self._assign(tasks)
        self._live = [True] * len(tasks)
        out: list[tuple[str, dict[str, Any]]] = []
        for s, (task, e) in enumerate(zip(tasks, self._slots, strict=True)):
            self._last_task[e] = task.task_id
            self.real_resets += self.real
            try:
                out.append(self.envs[e].reset(task))
            except EnvError as err:
                self._live[s] = False
                self._last_task[e] = None
                out.append(("", {ENV_ERROR: str(err)}))
        return out

    def step(self, actions: Sequence[str | None]) -> list[StepTuple | None]:
        """Step every live slot that got an action, one env after the other."""
        if len(actions) != len(self._slots):
            raise ValueError(f"{len(actions)} actions for {len(self._slots)} slots")
        out: list[StepTuple | None] = [None] * len(actions)
        for s, action in enumerate(actions):
            if not self._live[s] or action is None:
                continue
            env_index = self._slots[s]
            self.real_steps += self.real
            try:
                obs, reward, terminated, truncated, info = self.envs[env_index].step(action)
            except EnvError as err:
                self._last_task[env_index] = None
                obs, reward, terminated, truncated, info = "", 0, True, False, {ENV_ERROR: str(err)}
            out[s] = (obs, reward, terminated, truncated, info)
            if terminated or truncated:
                self._live[s] = False
        return out

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()


class CappedEnvList(EnvList):
    """An ``EnvList`` that takes at most ``budget`` real steps, then cuts the episodes.

    A slot whose step would exceed the budget is not stepped: it ends with
    ``info[ENV_ERROR] = BUDGET_CUT`` (so the learners skip the unfinished episode).
    """

    def __init__(self, factory: Callable[[], Any], budget: int) -> None:
        super().__init__(factory=factory)
        self.budget = budget

    def step(self, actions: Sequence[str | None]) -> list[StepTuple | None]:
        """Step live slots while budget remains; the rest are cut, unstepped."""
        allowed, cut = list(actions), []
        left = self.budget - self.real_steps
        for s, action in enumerate(actions):
            if action is None or not self._live[s]:
                continue
            if left > 0:
                left -= 1
            else:
                allowed[s] = None
                cut.append(s)
        out = super().step(allowed)
        for s in cut:
            self._live[s] = False
            out[s] = ("", 0.0, True, False, {ENV_ERROR: BUDGET_CUT})
        return out
