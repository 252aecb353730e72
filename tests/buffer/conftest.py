"""Buffer fixtures: the packaged (offline) embedder and real LanceDB buffers in temp dirs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from components.buffer import ReplayBuffer, WordLlamaEmbedder
from components.buffer.embedders import Embedder
from components.config import BufferConfig


@pytest.fixture(scope="session")
def wordllama() -> Embedder:
    """The fast packaged embedder (loaded once per session)."""
    emb = WordLlamaEmbedder()
    emb.embed(["warm up"])
    return emb


@pytest.fixture
def open_buffer(tmp_path: Path, wordllama: Embedder) -> Callable[..., ReplayBuffer]:
    """Open a real LanceDB buffer in a temp dir with config overrides."""

    def _open(path: Path | None = None, **overrides: object) -> ReplayBuffer:
        cfg = BufferConfig(embedder="wordllama", **overrides)  # type: ignore[arg-type]
        return ReplayBuffer.open(path or tmp_path / "buffer", cfg, embedder=wordllama)

    return _open
