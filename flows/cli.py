"""How the ``python -m flows.<module>`` entry points run as commands.

Their arguments are parsed with argparse, so ``--help`` prints the usage and exits 0
without doing any work, and an unknown argument is a usage error (exit 2). Before a flow
starts, its arguments are checked; as for every ``dreamgym`` command
(components/cli_process.py), a failure the user can act on ends the command with one
``error:`` line on stderr and its exit code (2 for a bad parameter or argument value, 1
for a workspace git could not prepare) instead of Prefect's and Python's tracebacks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from components.cli_process import EXIT_CONFIG, EXIT_ERROR
from components.config import ConfigError


def fail(message: object, code: int = EXIT_CONFIG) -> NoReturn:
    """End the command: ``error: <message>`` (one line) on stderr, exit ``code``."""
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(code)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A bad parameter (``ConfigError``: exit 2) or a workspace that could not be prepared
    (``WorkspaceError``: exit 1) ends the command with one line; anything else is raised."""
    from flows.workspaces import WorkspaceError

    try:
        yield
    except ConfigError as err:
        fail(err, EXIT_CONFIG)
    except WorkspaceError as err:
        fail(err, EXIT_ERROR)
