"""Behaviour policies for real-data collection: expert, noisy expert and random.

* ``expert`` plays TextWorld's winning policy from the current state (it replans, so it
  also recovers from any detour).
* ``noisy`` plays the expert, but with probability ``epsilon`` a uniformly random
  admissible command and with probability ``p_invalid`` an inadmissible one.
* ``random`` plays a uniformly random admissible command, or with probability
  ``p_invalid`` an inadmissible one.
* ``explore`` is random play that prefers what it has not tried yet: a uniformly random
  admissible command among those never issued in this state's room this episode (any
  admissible one when all were); it covers a game's rooms and object states with fewer
  steps than ``random`` (the experience model learns the world from such logs).

Randomness comes only from the ``random.Random`` each policy is built with, so an
episode is a pure function of its seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from components.envs.base import ADMISSIBLE, Env

EXPERT = "expert"  # follows the game's walkthrough
POLICIES = (EXPERT, "noisy", "random", "explore")

# objects that no generated game contains, and verbs that fit no object
_MISSING_OBJECTS = (
    "unicorn",
    "golden crown",
    "spaceship",
    "violin",
    "dragon egg",
    "telescope",
    "treasure map",
    "crystal ball",
)
_ODD_VERBS = ("climb", "sing to", "dance with", "fold", "throw", "burn", "kick")
_DIRECTIONS = ("north", "south", "east", "west")


class ExpertSource(Protocol):
    """Anything that can tell the expert's next command (TextWorldEnv does)."""

    def expert_action(self) -> str | None:
        """The expert's next command from the current state, if any."""
        ...


class ExpertEnv(Env, ExpertSource, Protocol):
    """An env that also knows the expert's next command (what collection needs)."""


class Policy(Protocol):
    """Chooses the next command from the env's info (and the expert, if it needs it)."""

    name: str

    def act(self, info: dict[str, Any], expert: ExpertSource) -> str:
        """The next command."""
        ...


def _objects(admissible: Sequence[str]) -> list[str]:
    return sorted({a[len("examine ") :] for a in admissible if a.startswith("examine ")})


def invalid_command(admissible: Sequence[str], rng: random.Random) -> str:
    """A command that is not admissible here: a missing object, a wall, a nonsense verb."""
    allowed = {a.lower() for a in admissible}
    objects = _objects(admissible)
    for _ in range(20):
        kind = rng.randrange(3)
        if kind == 0:
            verb = rng.choice(("take", "open", "examine", "eat"))
            cmd = f"{verb} {rng.choice(_MISSING_OBJECTS)}"
        elif kind == 1:
            cmd = f"go {rng.choice(_DIRECTIONS)}"
        elif objects:
            cmd = f"{rng.choice(_ODD_VERBS)} {rng.choice(objects)}"
        else:
            continue
        if cmd not in allowed:
            return cmd
    return f"take {rng.choice(_MISSING_OBJECTS)}"


def _random_admissible(info: dict[str, Any], rng: random.Random) -> str:
    admissible = info.get(ADMISSIBLE) or []
    return rng.choice(admissible) if admissible else "look"


@dataclass
class ExpertPolicy:
    """Follows the expert; falls back to a random admissible command if it has no plan."""

    rng: random.Random
    name: str = "expert"

    def act(self, info: dict[str, Any], expert: ExpertSource) -> str:
        """The expert's command (or a random admissible one when there is no plan)."""
        return expert.expert_action() or _random_admissible(info, self.rng)


@dataclass
class NoisyPolicy:
    """The expert with epsilon-random and p_invalid-inadmissible commands mixed in."""

    rng: random.Random
    epsilon: float
    p_invalid: float
    name: str = "noisy"

    def act(self, info: dict[str, Any], expert: ExpertSource) -> str:
        """An inadmissible, a random admissible or the expert's command."""
        u = self.rng.random()
        if u < self.p_invalid:
            return invalid_command(info.get(ADMISSIBLE) or [], self.rng)
        if u < self.p_invalid + self.epsilon:
            return _random_admissible(info, self.rng)
        return expert.expert_action() or _random_admissible(info, self.rng)


@dataclass
class RandomPolicy:
    """Uniform over admissible commands, with p_invalid-inadmissible ones mixed in."""

    rng: random.Random
    p_invalid: float
    name: str = "random"

    def act(self, info: dict[str, Any], expert: ExpertSource) -> str:
        """An inadmissible or a uniformly random admissible command."""
        del expert
        if self.rng.random() < self.p_invalid:
            return invalid_command(info.get(ADMISSIBLE) or [], self.rng)
        return _random_admissible(info, self.rng)


@dataclass
class ExplorePolicy:
    """Random play preferring commands not yet tried in the current room (no expert)."""

    rng: random.Random
    p_invalid: float
    name: str = "explore"
    _tried: set[tuple[str, str]] = field(default_factory=set)  # one policy per episode

    def act(self, info: dict[str, Any], expert: ExpertSource) -> str:
        """An untried admissible command of this room (or any, once all were tried)."""
        del expert
        if self.rng.random() < self.p_invalid:
            return invalid_command(info.get(ADMISSIBLE) or [], self.rng)
        admissible = info.get(ADMISSIBLE) or []
        room = str(info.get("location", ""))
        fresh = [a for a in admissible if (room, a) not in self._tried]
        action = self.rng.choice(fresh or admissible) if admissible else "look"
        self._tried.add((room, action))
        return action


def make_policy(name: str, seed: int, epsilon: float, p_invalid: float) -> Policy:
    """A policy by name, with its own RNG seeded by ``seed``."""
    rng = random.Random(seed)
    if name == "expert":
        return ExpertPolicy(rng)
    if name == "noisy":
        return NoisyPolicy(rng, epsilon=epsilon, p_invalid=p_invalid)
    if name == "random":
        return RandomPolicy(rng, p_invalid=p_invalid)
    if name == "explore":
        return ExplorePolicy(rng, p_invalid=p_invalid)
    raise ValueError(f"unknown policy {name!r}; known: {list(POLICIES)}")


def behaviour_key(name: str, epsilon: float, p_invalid: float) -> tuple[object, ...]:
    """The parameters that shape a policy's episodes (part of its episode ids)."""
    if name == "noisy":
        return (name, epsilon, p_invalid)
    if name in ("random", "explore"):
        return (name, p_invalid)
    return (name,)
