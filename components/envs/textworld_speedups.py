"""TextWorld made cheaper where it wastes work, with byte-identical games and play (tested).

- Fact sorting: TextWorld's logic engine sorts the facts of each signature every time it
  tries a rule's precondition (``State._all_applicable_assignments``): making one hard
  treasure-hunter game sorts ~2 million facts in ~200,000 calls, every comparison a chain
  of Python ``__lt__`` and ``__eq__`` calls on ``Proposition`` and ``Variable``. Sorting by
  a key of the same strings gives exactly the same order (a proposition compares by its
  name, then its arguments one by one, each by its name then its type). And it sorts the
  same few sets over and over (~160,000 sorts of ~800 distinct sets for one such game):
  a state's fact sets remember their sorted order until they change.
- Compiling: Inform 7's ``ni`` writes an HTML index of the project on every compile, which
  nobody reads (the project folder is temporary); ``-noindex`` skips it and leaves the
  story file the same.

Both: ``bench/results/game_generation.json`` (same games, side by side).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import subprocess
from collections.abc import Callable, Iterable, Iterator
from typing import Any

NO_INDEX = "-noindex"  # an ni option (Inform 7 6M62): no Index/ pages for the project


def proposition_key(prop: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The strings ``Proposition.__lt__`` compares, in the order it compares them."""
    return prop.name, tuple([(var.name, var.type) for var in prop.arguments])


class FactSet(set):
    """A set that remembers its sorted order (``keyed_sorted``) until it changes: every
    method that changes a set forgets it; ``copy`` keeps it (the same members)."""

    __slots__ = ("order",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.order: list[Any] | None = None

    def copy(self) -> FactSet:
        """A FactSet with the same members and the order they sort in."""
        twin = FactSet(self)
        twin.order = self.order
        return twin

    def add(self, item: Any) -> None:
        """``set.add``; the order is forgotten only when ``item`` is new."""
        if item not in self:
            self.order = None
            super().add(item)

    def discard(self, item: Any) -> None:
        """``set.discard``; the order is forgotten only when ``item`` was a member."""
        if item in self:
            self.order = None
            super().discard(item)


def _forgetting(name: str) -> Callable[..., Any]:
    real = getattr(set, name)

    def method(self: FactSet, *args: Any) -> Any:
        self.order = None
        return real(self, *args)

    method.__name__ = name
    method.__doc__ = f"``set.{name}``; the sorted order is forgotten."
    return method


# every other way a set changes in place (TextWorld itself only adds and discards)
for _name in (
    "remove",
    "pop",
    "clear",
    "update",
    "difference_update",
    "intersection_update",
    "symmetric_difference_update",
    "__ior__",
    "__iand__",
    "__isub__",
    "__ixor__",
):
    setattr(FactSet, _name, _forgetting(_name))


def keyed_sorted(proposition: type) -> Callable[..., list[Any]]:
    """``sorted`` that orders a list of ``proposition`` instances by ``proposition_key``
    and reuses a ``FactSet``'s remembered order (anything else, or a call with a key,
    goes to the builtin untouched)."""
    plain = builtins.sorted

    def by_key(items: list[Any], reverse: bool) -> list[Any]:
        # exact type: a subclass may compare its own way
        if items and all(type(item) is proposition for item in items):
            return plain(items, key=proposition_key, reverse=reverse)
        return plain(items, reverse=reverse)

    def sorted_(iterable: Iterable[Any], /, *, key: Any = None, reverse: bool = False) -> Any:
        if key is not None:
            return plain(iterable, key=key, reverse=reverse)
        if type(iterable) is FactSet and not reverse:
            if iterable.order is None:
                iterable.order = by_key(list(iterable), False)
            return list(iterable.order)  # the caller's own list, as sorted gives
        return by_key(list(iterable), reverse)

    return sorted_


@functools.cache
def use_keyed_fact_sort() -> None:
    """Make ``textworld.logic`` sort facts by key, and its states keep their facts in
    ``FactSet``s, in this process (once; idempotent).

    Only that module's ``sorted`` name and ``State.__init__`` change: states hold the same
    facts and answer the same; nothing outside the module sees a change.
    """
    import textworld.logic

    state = textworld.logic.State
    real_init = state.__init__

    @functools.wraps(real_init)  # __wrapped__: TextWorld's own (bench/game_generation.py)
    def __init__(self: Any, logic: Any, facts: Iterable[Any] | None = None) -> None:
        real_init(self, logic)
        self._facts.default_factory = FactSet  # copy() copies each FactSet as a FactSet
        if facts:
            self.add_facts(facts)

    state.__init__ = __init__
    textworld.logic.sorted = keyed_sorted(textworld.logic.Proposition)


class _SubprocessWithoutIndex:
    """The ``subprocess`` module as TextWorld's Inform 7 compiler sees it: ``ni`` is run
    with ``-noindex``; every other name is the real module's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def check_output(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        """``subprocess.check_output``, with ``-noindex`` added to an ``ni`` command."""
        if isinstance(cmd, list | tuple) and cmd and os.path.basename(str(cmd[0])) == "ni":
            cmd = [*cmd, NO_INDEX] if NO_INDEX not in cmd else list(cmd)
        return subprocess.check_output(cmd, *args, **kwargs)


@contextlib.contextmanager
def ni_without_index() -> Iterator[None]:
    """While open, TextWorld's ``compile_game`` runs ``ni`` with ``-noindex`` (~18% less
    compile time; the same story file)."""
    from textworld.generator.inform7 import world2inform7

    real = world2inform7.subprocess
    world2inform7.subprocess = _SubprocessWithoutIndex()  # the name its compiler reads
    try:
        yield
    finally:
        world2inform7.subprocess = real
