"""Loaded TextWorld games, and what they answered, shared by the envs of one factory.

A TextWorld game is deterministic: what it answers to a command depends only on the
commands sent since its reset. So every answer is kept in a tree per game (one node per
command path), and an env that walks a known path reads the answers instead of running the
game. RL rounds and evaluation passes replay the same games with similar policies, so
most resets and many steps are answered from the tree. An engine is only asked when an
episode leaves the known paths; it then catches up on the commands it missed (an engine
never runs a command its episode did not send), so no episode costs more engine work
than it did without the tree.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

GameKey = tuple[str, bool, str]  # (game file, expert plan requested, state format)


@dataclass(frozen=True)
class Answer:
    """What a game answered to a reset or a command, trimmed to what the env reads.

    ``description`` and ``inventory`` are already rendered (from the facts, for the
    compact state format; the game's own text otherwise), so the facts are not kept.
    """

    feedback: str
    description: str
    inventory: str
    admissible: tuple[str, ...]
    won: bool
    lost: bool
    score: Any
    max_score: Any
    objective: str | None = None
    plan: tuple[str, ...] = ()  # TextWorld's winning commands (expert envs only)


def intern_all(items: Any) -> tuple[str, ...]:
    """``items`` as a tuple of interned strings (kept answers share their command texts)."""
    return tuple(sys.intern(str(s)) for s in items or ())


class Node:
    """One command path of a game: the answer at its end and the paths that extend it."""

    __slots__ = ("answer", "next")

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.next: dict[str, Node] = {}


@dataclass
class Engine:
    """A loaded game and the commands it was sent since its last reset (None: not reset)."""

    tw: Any
    at: tuple[str, ...] | None = field(default=None)

    def close(self) -> None:
        """Close the game (a dead engine may fail to close: ignored)."""
        with contextlib.suppress(Exception):
            self.tw.close()


class EnginePool:
    """Loaded games and their answer trees, shared by the envs of one factory.

    Starting a game (parsing its .json knowledge base, loading the story file) costs ~3x
    a reset; RL rounds and evaluation restart the same games again and again, on whichever
    env slot is free. An env gives its engine back here when it switches games or closes,
    and takes an idle one of its next game if there is one. At most ``max_idle`` idle
    engines (~2.4 MB each) are kept; the least recently returned are closed first. The
    default holds a GRPO round's engines (4 per game) for all 160 train games of the cpu
    profile: with 256, ~70% of the restarts in a real GRPO run reloaded their game.

    At most ``max_answers`` answers (~1.5 KB each) are kept; past that, new paths are
    played on engines only (the known ones are still read). Valid actions are kept for at
    most ``max_valid_per_game`` sets of facts per game.
    """

    def __init__(
        self, max_idle: int = 1024, max_answers: int = 200_000, max_valid_per_game: int = 20_000
    ) -> None:
        self.max_idle = max_idle
        self.max_answers = max_answers
        self._idle: OrderedDict[GameKey, list[Any]] = OrderedDict()
        self._n_idle = 0
        self._roots: dict[GameKey, Node] = {}
        self._valid: dict[str, dict[Any, list[Any]]] = {}  # per game file: facts -> actions
        self.max_valid_per_game = max_valid_per_game
        self.n_answers = 0
        self.hits = self.misses = 0  # engines taken back / not found idle
        self.answered = self.played = 0  # resets and steps read from the trees / run

    # -- engines -------------------------------------------------------------------------

    def take(self, key: GameKey) -> Any | None:
        """An idle engine of ``key`` (game path, expert, state format), or None."""
        engines = self._idle.get(key)
        if not engines:
            self.misses += 1
            return None
        self.hits += 1
        self._n_idle -= 1
        engine = engines.pop()
        if not engines:
            del self._idle[key]
        return engine

    def give(self, key: GameKey, engine: Any) -> None:
        """Keep ``engine`` for reuse (closing the oldest idle engines beyond ``max_idle``)."""
        self._idle.setdefault(key, []).append(engine)
        self._idle.move_to_end(key)
        self._n_idle += 1
        while self._n_idle > self.max_idle:
            oldest = next(iter(self._idle))
            self._idle[oldest].pop(0).close()
            self._n_idle -= 1
            if not self._idle[oldest]:
                del self._idle[oldest]

    def close(self) -> None:
        """Close every idle engine (the answers stay: they remain true)."""
        for engines in self._idle.values():
            for engine in engines:
                engine.close()
        self._idle.clear()
        self._n_idle = 0

    def share_valid_actions(self, game_file: str, tw: Any) -> bool:
        """Make ``tw`` (a started game) look up its valid actions per set of facts in a
        table shared by every engine of ``game_file``; False if its game was not found.

        TextWorld recomputes every applicable action of every rule after each command
        (~40% of a step); a state's facts determine them, and states recur across
        episodes even where the command paths differ (a failed command changes nothing).
        """
        env = tw
        while env is not None:
            game = getattr(env, "_game", None)
            state = getattr(getattr(game, "world", None), "_state", None)
            if state is not None:
                state.__class__ = _memo_state_class()
                state.valid_memo = self._valid.setdefault(game_file, {})
                state.valid_room = self.max_valid_per_game
                return True
            env = getattr(env, "_wrapped_env", None)
        return False

    # -- answers -------------------------------------------------------------------------

    def known(self, key: GameKey) -> Node | None:
        """The answer tree of ``key``'s game: its reset's node (None: never reset)."""
        found = self._roots.get(key)
        if found is not None:
            self.answered += 1
        return found

    def known_after(self, node: Node, command: str) -> Node | None:
        """The node one ``command`` below ``node``, if that path was played."""
        found = node.next.get(command)
        if found is not None:
            self.answered += 1
        return found

    def remember(self, key: GameKey, answer: Answer) -> Node | None:
        """Keep ``answer`` as the reset of ``key``'s game (None once ``max_answers`` are kept)."""
        child = self._keep(answer)
        if child is not None:
            self._roots[key] = child
        return child

    def remember_after(self, node: Node, command: str, answer: Answer) -> Node | None:
        """Keep ``answer`` one ``command`` below ``node`` (None once ``max_answers`` are kept)."""
        child = self._keep(answer)
        if child is not None:
            node.next[command] = child
        return child

    def _keep(self, answer: Answer) -> Node | None:
        if self.n_answers >= self.max_answers:
            return None
        self.n_answers += 1
        return Node(answer)


@functools.cache
def _memo_state_class() -> type:
    """TextWorld's ``State`` with its applicable actions memoized per set of facts (its
    copies share the table); built on first use to keep textworld's import lazy."""
    from textworld.logic import State

    class MemoState(State):
        valid_memo: dict[Any, list[Any]]
        valid_room: int  # entries the table may hold

        def copy(self) -> State:
            twin = super().copy()
            twin.__class__ = MemoState
            twin.valid_memo, twin.valid_room = self.valid_memo, self.valid_room
            return twin

        def all_applicable_actions(self, rules: Any, mapping: Any = None) -> Any:
            rules = list(rules)
            key = (frozenset(self.facts), tuple(r.name for r in rules), mapping is None)
            found = self.valid_memo.get(key)
            if found is None:
                found = list(super().all_applicable_actions(rules, mapping))
                if len(self.valid_memo) < self.valid_room:
                    self.valid_memo[key] = found
            return iter(found)

    return MemoState
