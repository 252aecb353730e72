"""Replay buffer: LanceDB store of real + synthetic transitions with semantic retrieval.

The only package that imports LanceDB. Its names load on first use (PEP 562): a policy
that only embeds text (``components.buffer.embedders``) does not pay for LanceDB and
pyarrow (~1.7 s a process).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# public name -> the submodule defining it
_EXPORTS = {
    "SEED_TAG": "build",
    "build_buffer": "build",
    "load_transitions": "build",
    "Embedder": "embedders",
    "SentenceTransformerEmbedder": "embedders",
    "WordLlamaEmbedder": "embedders",
    "embed_text": "embedders",
    "make_embedder": "embedders",
    "minilm_embedder": "embedders",
    "BufferCorruptedError": "errors",
    "BufferNotFoundError": "errors",
    "BufferReadOnlyError": "errors",
    "BufferSchemaError": "errors",
    "BufferVersionError": "errors",
    "EmbedderMismatchError": "errors",
    "ReplayBufferError": "errors",
    "AddResult": "store",
    "ReplayBuffer": "store",
    "filter_sql": "store",
    "fork_buffer": "store",
}
__all__ = [
    "SEED_TAG",
    "AddResult",
    "BufferCorruptedError",
    "BufferNotFoundError",
    "BufferReadOnlyError",
    "BufferSchemaError",
    "BufferVersionError",
    "Embedder",
    "EmbedderMismatchError",
    "ReplayBuffer",
    "ReplayBufferError",
    "SentenceTransformerEmbedder",
    "WordLlamaEmbedder",
    "build_buffer",
    "embed_text",
    "filter_sql",
    "fork_buffer",
    "load_transitions",
    "make_embedder",
    "minilm_embedder",
]

if TYPE_CHECKING:
    from components.buffer.build import SEED_TAG, build_buffer, load_transitions
    from components.buffer.embedders import (
        Embedder,
        SentenceTransformerEmbedder,
        WordLlamaEmbedder,
        embed_text,
        make_embedder,
        minilm_embedder,
    )
    from components.buffer.errors import (
        BufferCorruptedError,
        BufferNotFoundError,
        BufferReadOnlyError,
        BufferSchemaError,
        BufferVersionError,
        EmbedderMismatchError,
        ReplayBufferError,
    )
    from components.buffer.store import AddResult, ReplayBuffer, filter_sql, fork_buffer


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first access."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
