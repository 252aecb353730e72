"""The replay buffer's exceptions: each names the table path and the problem."""

from __future__ import annotations


class ReplayBufferError(RuntimeError):
    """Base class of every replay-buffer failure."""


class BufferNotFoundError(ReplayBufferError):
    """No buffer table at the given path (and creation was not requested)."""


class BufferCorruptedError(ReplayBufferError):
    """The table exists but cannot be read: missing or damaged files, broken invariants."""


class BufferSchemaError(ReplayBufferError):
    """The table's columns or schema version differ from what this code reads."""


class EmbedderMismatchError(BufferSchemaError):
    """The table was embedded with another model or dimension than the configured one."""


class BufferReadOnlyError(ReplayBufferError):
    """A write was attempted on a checked-out (historical) version."""


class BufferVersionError(ReplayBufferError):
    """Unknown version/tag, an invalid tag name, or a tag that already points elsewhere."""


def first_line(err: BaseException) -> str:
    """The first line of an error's text (at most 400 characters), for messages."""
    text = str(err).strip().splitlines()
    return text[0][:400] if text else type(err).__name__
