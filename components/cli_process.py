"""How every ``dreamgym`` command runs as a process: offline and quiet, and a failure the
user can act on ends it with one line on stderr and its exit code (anything else is a bug
and keeps its traceback). Used by components/cli.py, the server and bench tools.
"""

from __future__ import annotations

import errno
import inspect
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

# offline, quiet defaults for every library the stages use
_QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
    # third-party log noise off by default (set the variable to bring it back)
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # "Creating/Updating database tables" per stage
    "LANCEDB_LOG": "error",  # lance's Rust logger: WARN lines per IVF partition
}
# Python loggers of libraries that log at INFO by default (Great Expectations: ~200 lines
# per ingest); their level is DREAMGYM_LIB_LOG_LEVEL (default WARNING)
_NOISY_LOGGERS = ("great_expectations", "evidently", "httpx", "urllib3", "textworld")


# Exit codes of the known failures (anything else is a bug and keeps its traceback).
EXIT_ERROR, EXIT_CONFIG, EXIT_BUDGET, EXIT_BUSY = 1, 2, 3, 75  # 75: EX_TEMPFAIL, retry later
# filesystem errors a user can fix (disk full, permissions, read-only, a folder for a file)
_FS_ERRNOS = {
    errno.ENOSPC: "free some disk space, then rerun",
    errno.EDQUOT: "free some space (disk quota exceeded), then rerun",
    errno.EFBIG: "the file is too large for this filesystem",
    errno.EACCES: "check the permissions of that path",
    errno.EPERM: "check the permissions of that path",
    errno.EROFS: "the filesystem is read-only: use a writable --root",
    errno.EISDIR: "a folder is in the way of a file",
    errno.ENOTDIR: "a file is in the way of a folder",
}


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _known_error(err: BaseException) -> tuple[int, str] | None:
    """(exit code, one-line message) of a failure the user can act on, else None."""
    from components.config import ConfigError
    from components.io import InputError, OutputBusyError, OutputWriteError

    # classes of modules not imported yet cannot be what was raised: no import for them
    mods = sys.modules
    teacher, annotate = mods.get("components.teacher.base"), mods.get("components.teacher.annotate")
    buffer = mods.get("components.buffer.store")
    rl = mods.get("components.stages.rl_seed")
    if rl and isinstance(err, rl.NoUpdateError):
        return EXIT_ERROR, str(err)
    if isinstance(err, ConfigError):
        return EXIT_CONFIG, str(err)
    if isinstance(err, OutputBusyError):
        return EXIT_BUSY, str(err)
    if teacher and isinstance(err, teacher.BudgetExhaustedError):
        return EXIT_BUDGET, f"{err}; rerun to resume. stats: {json.dumps(err.stats)}"
    if (teacher and isinstance(err, teacher.TeacherError)) or (
        annotate and isinstance(err, annotate.AnnotationFileError)
    ):
        return EXIT_ERROR, str(err)
    if buffer and isinstance(err, buffer.ReplayBufferError):
        return EXIT_ERROR, str(err)
    envs = mods.get("components.envs.base")
    if envs and isinstance(err, envs.EnvError):  # e.g. an AgentGym server out of reach
        return EXIT_ERROR, str(err)
    if _old_store(err):  # MLflow's own message says how to migrate: first line only
        return EXIT_ERROR, f"mlflow.db: {str(err).strip().splitlines()[0]}"
    if _half_built_store(err):
        # a store half-built before stores were built whole (components/tracking.py)
        return EXIT_ERROR, (
            "mlflow.db is half-built (a first run was stopped while MLflow created it): "
            "move it away (mv mlflow.db mlflow.db.broken) and rerun"
        )
    if _damaged_store(err):
        return EXIT_ERROR, (
            f"mlflow.db is not a readable SQLite database ({_first_line(err)}): move it away "
            "(mv mlflow.db mlflow.db.broken; `sqlite3 mlflow.db.broken .recover` may save its "
            "runs) and rerun; the pipeline's data, models and metrics are files outside it"
        )
    if isinstance(err, InputError | FileNotFoundError) and err.args:
        return EXIT_ERROR, str(err)  # FileNotFoundError: the stages' "run X first" hints
    if isinstance(err, OutputWriteError) or (isinstance(err, OSError) and err.errno in _FS_ERRNOS):
        hint = _FS_ERRNOS.get(err.errno or 0)
        what = err.strerror or str(err)
        where = f"{err.filename}: " if err.filename else ""
        message = f"{where}{what}" + (f" ({hint})" if hint else "")
        if isinstance(err, OutputWriteError):
            message += "; the previous outputs are unchanged"
        return EXIT_ERROR, message
    return None


def _old_store(err: BaseException) -> bool:
    """An MLflow error for a store made by another MLflow version (``mlflow db upgrade``)."""
    mlflow = sys.modules.get("mlflow.exceptions")
    return bool(mlflow) and isinstance(err, mlflow.MlflowException) and "out-of-date" in str(err)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or during (at most 8)."""
    chain: list[BaseException] = []
    at: BaseException | None = err
    while at is not None and len(chain) < 8:
        chain.append(at)
        at = at.__cause__ or at.__context__
    return chain


def _damaged_store(err: BaseException) -> bool:
    """SQLite found the store's file damaged or not a database at all (truncated, overwritten)."""
    sql = sys.modules.get("sqlalchemy.exc")
    damaged = ("database disk image is malformed", "file is not a database")
    return bool(sql) and any(
        isinstance(e, sql.DatabaseError) and any(d in str(e) for d in damaged) for e in _chain(err)
    )


def _first_line(err: BaseException) -> str:
    """SQLite's own words for the innermost error, without SQLAlchemy's SQL and links."""
    inner = _chain(err)[-1]
    text = str(getattr(inner, "orig", None) or inner).strip()
    return text.splitlines()[0][:200] if text else type(inner).__name__


def _half_built_store(err: BaseException) -> bool:
    """An MLflow error caused by SQLite finding the store's schema half there."""
    sql, mlflow = sys.modules.get("sqlalchemy.exc"), sys.modules.get("mlflow.exceptions")
    if not (sql and mlflow):
        return False
    chain = _chain(err)
    broken = ("already exists", "duplicate column name", "no such column", "no such table")
    return any(isinstance(e, mlflow.MlflowException) for e in chain) and any(
        isinstance(e, sql.OperationalError) and any(b in str(e) for b in broken) for e in chain
    )


@contextmanager
def _errors() -> Iterator[None]:
    """Known failures end the command with one line on stderr and their exit code."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as err:
        known = _known_error(err)
        if known is None:
            raise
        code, message = known
        typer.echo(f"error: {_one_line(message)}", err=True)
        raise typer.Exit(code) from None


class _FlagsTakeNoValue:
    """Help shows no value type after a flag (typer 0.29's rich help writes ``<bool>``, as
    if ``--fresh`` took a value)."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option


class _Command(_FlagsTakeNoValue, typer.core.TyperCommand):
    pass


class _Group(_FlagsTakeNoValue, typer.core.TyperGroup):
    pass


class DreamgymTyper(typer.Typer):
    """The Typer app of ``dreamgym``: a Ctrl-C ends with one line, and each command's
    summary in ``--help`` is its docstring's first paragraph on one line."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=kwargs.pop("cls", _Group), **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from components.pool import EXIT_INTERRUPTED, Interrupted

        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as end:
            # typer turns a KeyboardInterrupt outside the worker pools (which print their
            # own line) into a silent exit 130, which reads like a crash
            if end.code == EXIT_INTERRUPTED and not isinstance(end, Interrupted):
                typer.echo(
                    "interrupted: stopped by Ctrl-C; finished outputs are kept, rerun to resume",
                    err=True,
                )
            raise

    def command(self, name: str | None = None, **kwargs: Any) -> Any:
        """``Typer.command``, with the summary typer's rich help would break at each newline."""
        parent = super()

        def register(function: Any) -> Any:
            first = inspect.cleandoc(function.__doc__ or "").split("\n\n")[0]
            summary = kwargs.pop("short_help", None) or " ".join(first.split()) or None
            kwargs.setdefault("cls", _Command)
            return parent.command(name, short_help=summary, **kwargs)(function)

        return register


def _quiet_libraries(level: str) -> None:
    """Records of ``_NOISY_LOGGERS`` below ``level`` are dropped by the root handlers."""
    threshold = logging.getLevelName(level.upper())
    if not isinstance(threshold, int):
        return  # an unknown level name: leave the libraries as they are

    def keep(record: logging.LogRecord) -> bool:
        noisy = record.name.split(".", 1)[0] in _NOISY_LOGGERS
        return not noisy or record.levelno >= threshold

    # a filter on the handlers, not logger levels: GX sets INFO on some module loggers
    for handler in logging.getLogger().handlers:
        if not any(getattr(f, "__name__", "") == keep.__name__ for f in handler.filters):
            handler.addFilter(keep)


def offline_and_quiet() -> None:
    """The stages' process setup: offline, no telemetry, reproducible CPU kernels, INFO
    logs without library noise."""
    from components.cpu_kernels import pin_cpu_kernels

    pin_cpu_kernels()  # before any stage imports torch
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)  # before any worker is spawned: they inherit it
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    _quiet_libraries(os.environ.get("DREAMGYM_LIB_LOG_LEVEL", "WARNING"))
