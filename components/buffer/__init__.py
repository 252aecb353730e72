"""Replay buffer: LanceDB store of real + synthetic transitions with semantic retrieval.

The only package that imports LanceDB. Heavy embedding libraries load lazily.
"""

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
