"""What the command-scoring policy sees: an episode memory and per-command features.

The cpu-profile policy (components/agent/scorer.py) scores each admissible command. Its
inputs are built here from the same ``Observation`` every policy gets (task, the episode's
(action, resulting state) history, current state, admissible commands), so it runs
unchanged in the real and the synthetic env:

* ``EpisodeMemory`` (components/memory.py) is what the agent remembers of its own
  episode, nothing privileged: rooms visited, (room, command) pairs tried, where each
  exit led, and how far it got through the task's instructions.
* ``Featurizer.decide`` turns (memory, admissible commands) into a candidate matrix
  ``[k, F]`` and a context vector: frozen text embeddings of the command, the current
  instruction sentence, the room, the inventory and the last action (products of them
  give the head word-overlap signals), plus, in the ``full`` design, a few scalars per
  command (its verb, overlap with the instruction sentences ahead and behind the
  pointer, whether the instruction names its things exactly or only inside a longer
  name, whether it was tried here already, where a ``go`` leads and whether it leads
  toward the nearest room with an exit never taken).
* On web pages (``page``, MiniWoB++) each command also gets the page features the
  experience model reads (components/experience/grounded_page.py: how the page the command
  leaves meets the instruction's values and targets, what it clicks) and whether it types
  the value the instruction pairs with that field: an MLP over 128 embedding dims did not
  tell ``type [7] "jess"`` into Username from the same value into Password (login-user).

Frozen encoders keep it fast on two cores: embeddings are cached per string.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from components.envs.miniwob_dom import AS_ASKED
from components.experience.grounded_page import PAGE_FEATURES, last_click, page_features
from components.memory import (
    EXACT,
    NAMESAKE,
    NO_FRONTIER,
    OPPOSITE,
    VERBS,
    EpisodeMemory,
    command_content,
    content_words,
    naming,
    object_phrases,
    overlap,
    verb_in,
    verb_of,
)

if TYPE_CHECKING:
    from components.agent.policy import Observation
    from components.buffer.embedders import Embedder

Design = Literal["full", "embeddings"]
DESIGNS: tuple[Design, ...] = ("full", "embeddings")


_VERB_ONE_HOT = {v: [float(v == u) for u in (*VERBS, "other")] for v in (*VERBS, "other")}


def command_scalars(mem: EpisodeMemory, command: str, text: str | None = None) -> list[float]:
    """Hand-made features of one command given the memory (design ``full``).

    ``text`` is what the command's words are read from (a page command with its
    element's line, ``describe_commands``); the command itself by default.
    """
    verb = verb_of(command)
    text = command if text is None else text
    objects = command_content(text)
    tried_here = mem.tried.get((mem.location, command), 0)
    go = [0.0] * 7
    if verb == "go":
        direction = command[3:]
        dest = mem.exits.get((mem.location, direction))
        # a known exit's way to the frontier: where a depth-first explorer would go back to
        ahead = mem.frontier_distance(dest) if dest else NO_FRONTIER
        go = [
            1.0,
            float(dest is not None),
            min(mem.visits.get(dest, 0), 3) / 3 if dest else 0.0,
            float(OPPOSITE.get(mem.last_direction) == direction and mem.last_action[:3] == "go "),
            float(dest is None and tried_here == 0),
            float(dest is not None and ahead < mem.frontier_distance(mem.location)),
            ahead / NO_FRONTIER if dest else 0.0,
        ]
    return [
        *_VERB_ONE_HOT[verb],
        *_instruction_scalars(tuple(mem.step_words), mem.pointer, command, text),
        *_naming_scalars(mem.current_step, mem.instruction, command),
        len(objects & content_words(mem.inventory)) / len(objects) if objects else 0.0,
        min(tried_here, 3) / 3,
        min(mem.used.get(command, 0), 3) / 3,
        float(tried_here == 0),
        float(command == mem.last_action),
        *go,
    ]


@lru_cache(maxsize=65536)
def _instruction_scalars(
    sw: tuple[frozenset[str], ...], p: int, command: str, text: str
) -> tuple[float, ...]:
    """The features of a command that only the instruction and its pointer decide.

    Cached: an episode asks them for the same commands at the same pointer step after step.
    """
    ahead = sw[p] if p < len(sw) else frozenset()
    after = sw[p + 1] if p + 1 < len(sw) else frozenset()
    goal = frozenset().union(*sw)
    objects = command_content(text)
    ov = [overlap(text, s) for s in sw]
    next_overlap, next_verb = overlap(text, ahead), verb_in(command, ahead)
    return (
        next_overlap,
        overlap(text, after),
        max(ov[p:], default=0.0),
        max(ov[:p], default=0.0),
        next_verb,
        max(
            (verb_in(command, s) * (o > 0) for s, o in zip(sw[p:], ov[p:], strict=True)),
            default=0.0,
        ),
        next_overlap * next_verb,
        len(objects & goal) / len(objects) if objects else 0.0,
    )


@lru_cache(maxsize=65536)
def _naming_scalars(step: str, instruction: str, command: str) -> tuple[float, float, float]:
    """Shares of the things a command names that the step / instruction name exactly, and
    that the instruction names only inside a longer name ("keycard": "the type K keycard").

    Word overlap cannot tell them apart: every word of ``keycard`` is in the instruction.
    """
    phrases = object_phrases(command)
    if not phrases:
        return (0.0, 0.0, 0.0)
    n = len(phrases)
    in_goal = [naming(p, instruction) for p in phrases]
    return (
        sum(naming(p, step) == EXACT for p in phrases) / n,
        sum(k == EXACT for k in in_goal) / n,
        sum(k == NAMESAKE for k in in_goal) / n,
    )


def page_scalars(
    instruction: str, state: str, command: str, text: str, previous: str
) -> list[float]:
    """A page command's features (design ``full`` on web pages): the page it leaves against
    the instruction, and whether it types the instruction's value for that very field."""
    return [*page_features(instruction, state, command, previous), float(text.endswith(AS_ASKED))]


def context_scalars(mem: EpisodeMemory, max_steps: int) -> list[float]:
    """Hand-made features of the decision as a whole (design ``full``)."""
    n = max(1, len(mem.steps))
    return [
        mem.n_steps / max_steps,
        min(mem.visits.get(mem.location, 0), 4) / 4,
        mem.pointer / n,
        float(mem.pointer >= len(mem.steps)),
        float(mem.last_changed),
        float(len(mem.steps) == 1),
        mem.frontier_distance(mem.location) / NO_FRONTIER,
        float(mem.frontier_distance(mem.location) == 0),
    ]


N_COMMAND_SCALARS = len(VERBS) + 1 + 23  # verb one-hot + the 23 others (tested)
N_PAGE_SCALARS = PAGE_FEATURES + 1  # page_features and "as asked" (page_scalars)
N_CONTEXT_SCALARS = 8
N_CONTEXT_TEXTS = 4  # instruction sentence, surroundings, inventory, last action


class CachedEncoder:
    """A frozen text embedder truncated to ``dim`` (Matryoshka), cached per string."""

    def __init__(self, embedder: Embedder, dim: int, max_cache: int = 200_000) -> None:
        if dim > embedder.dim:
            raise ValueError(f"dim {dim} > the embedder's {embedder.dim}")
        self.embedder, self.dim, self.max_cache = embedder, dim, max_cache
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), dim]`` unit rows."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            if len(self._cache) + len(missing) > self.max_cache:
                self._cache.clear()  # rare; a bounded memory matters more than hits
            vecs = np.asarray(self.embedder.embed(missing), dtype=np.float32)[:, : self.dim]
            vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-8)
            self._cache.update(zip(missing, vecs, strict=True))
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._cache[t] for t in texts])


@dataclass(frozen=True)
class Decision:
    """The policy's inputs for one decision: one row per admissible command."""

    commands: tuple[str, ...]
    candidates: np.ndarray  # [k, candidate_dim]
    context: np.ndarray  # [context_dim]


class Featurizer:
    """Observation -> Decision (see the module docstring)."""

    def __init__(
        self,
        encoder: CachedEncoder,
        max_steps: int,
        design: Design = "full",
        max_memories: int = 8192,
        page: bool = False,
    ) -> None:
        if design not in DESIGNS:
            raise ValueError(f"unknown feature design {design!r}; known: {DESIGNS}")
        self.encoder, self.max_steps, self.design = encoder, max_steps, design
        self.page = page and design == "full"  # page scalars (web-page envs only)
        # episode prefix -> its memory: a live episode's next decision extends the last one
        # by one step instead of replaying the whole history (O(T) -> O(1) per decision)
        self._memories: OrderedDict[tuple[Any, ...], EpisodeMemory] = OrderedDict()
        self.max_memories = max_memories

    def memory(self, obs: Observation) -> EpisodeMemory:
        """The episode memory of ``obs`` (shared: read it, never change it)."""
        first = obs.initial_state if obs.initial_state is not None else obs.state
        key = (obs.instruction, first, obs.history)
        mem = self._memories.get(key)
        if mem is not None:
            return mem
        parent = self._memories.get((obs.instruction, first, obs.history[:-1]))
        if obs.history and parent is not None:
            mem = parent.copy()
            mem.update(*obs.history[-1])
        else:
            mem = EpisodeMemory.replay(obs.instruction, first, obs.history)
        self._memories[key] = mem
        if len(self._memories) > self.max_memories:
            self._memories.popitem(last=False)
        return mem

    @property
    def candidate_dim(self) -> int:
        """Width of a command's feature row."""
        scalars = N_COMMAND_SCALARS if self.design == "full" else 0
        return 3 * self.encoder.dim + scalars + (N_PAGE_SCALARS if self.page else 0)

    @property
    def context_dim(self) -> int:
        """Width of the context vector."""
        extra = N_CONTEXT_SCALARS if self.design == "full" else 0
        return N_CONTEXT_TEXTS * self.encoder.dim + extra

    def decide(self, obs: Observation) -> Decision:
        """The features of every admissible command of ``obs``."""
        if not obs.admissible:
            raise ValueError(
                "the scoring policy needs the admissible commands of every state "
                "(this env or state gave none)"
            )
        from components.envs.miniwob_dom import describe_commands

        mem = self.memory(obs)
        commands = tuple(obs.admissible)
        # on a web page a bare ``click [10]`` says nothing: read it with its element
        described = describe_commands(obs.state, commands, obs.instruction) or list(commands)
        goal = mem.current_step if self.design == "full" else obs.instruction
        texts = [goal, mem.surroundings, mem.inventory or "nothing", mem.last_action or "start"]
        ctx = self.encoder(texts)
        cmd = self.encoder(described)
        parts = [cmd, cmd * ctx[0], cmd * ctx[1]]
        context = ctx.reshape(-1)
        if self.design == "full":
            scalars = [command_scalars(mem, c, t) for c, t in zip(commands, described, strict=True)]
            if self.page:
                scalars = [
                    s + page_scalars(obs.instruction, obs.state, c, t, last_click(mem.history))
                    for s, c, t in zip(scalars, commands, described, strict=True)
                ]
            parts.append(np.asarray(scalars, np.float32))
            extra = np.asarray(context_scalars(mem, self.max_steps), np.float32)
            context = np.concatenate([context, extra])
        return Decision(commands, np.concatenate(parts, axis=1), context.astype(np.float32))
