"""TextWorld made cheaper where it wastes work, with byte-identical games and play (tested).

- Fact sorting: TextWorld's logic engine sorts the facts of each signature every time it
  tries a rule's precondition (``State._all_applicable_assignments``): making one hard
  treasure-hunter game sorts ~2 million facts in ~200,000 calls, every comparison a chain
  of Python ``__lt__`` and ``__eq__`` calls on ``Proposition`` and ``Variable``. Sorting by
  a key of the same strings gives exactly the same order (a proposition compares by its
  name, then its arguments one by one, each by its name then its type).
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


def keyed_sorted(proposition: type) -> Callable[..., list[Any]]:
    """``sorted`` that orders a list of ``proposition`` instances by ``proposition_key``
    (anything else, or a call with a key, goes to the builtin untouched)."""
    plain = builtins.sorted

    def sorted_(iterable: Iterable[Any], /, *, key: Any = None, reverse: bool = False) -> Any:
        if key is not None:
            return plain(iterable, key=key, reverse=reverse)
        items = list(iterable)
        # exact type: a subclass may compare its own way
        if items and all(type(item) is proposition for item in items):
            return plain(items, key=proposition_key, reverse=reverse)
        return plain(items, reverse=reverse)

    return sorted_


@functools.cache
def use_keyed_fact_sort() -> None:
    """Make ``textworld.logic`` sort facts by key in this process (once; idempotent).

    Only that module's ``sorted`` name is rebound: nothing else sees a change.
    """
    import textworld.logic

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
