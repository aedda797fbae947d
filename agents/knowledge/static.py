"""The router's embedder: a static embedding distilled from the bundled MiniLM, model2vec-style, no forward pass.

Each entry of MiniLM's vocabulary has one stored vector, made by running that token alone through MiniLM
(`scripts/distil_minilm.py`: PCA to 256 dimensions, weighted by how rare the token is, int8 with a scale per row);
a text's vector is the normalised sum of its tokens' rows, tokenised by MiniLM's own `tokenizer.json`. That is a
table look-up: tens of microseconds per message instead of MiniLM's few milliseconds, and about 8 MB mapped from
the package instead of MiniLM's 55 MB resident. It knows words, not sentences (word order and context are lost),
which is enough to tell the agents' examples apart (bench/routing.py has the figures beside MiniLM's); the
knowledge base searches with a real model.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agents.knowledge.embedders import Loaded

Array = NDArray[np.float32]
MODEL_DIR = Path(__file__).resolve().parent / "minilm"
TABLE_FILE = "static.npy"
SCALE_FILE = "static.scale.npy"


class StaticModel:
    """The table and the tokenizer (synchronous; loading reads a few MB, embedding is a look-up)."""

    def __init__(self, path: Path = MODEL_DIR, *, max_tokens: int = 512) -> None:
        from tokenizers import Tokenizer

        self.table: NDArray[np.int8] = np.load(path / TABLE_FILE, mmap_mode="r")
        # Read whole, then parsed (120 kB): np.load seeks, which a pipe cannot (tests/test_health_warm.py holds the
        # loading back with one).
        self.scale: Array = np.load(io.BytesIO((path / SCALE_FILE).read_bytes()))
        self.dim = int(self.table.shape[1])
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_tokens)

    def encode(self, texts: list[str]) -> Array:
        """One unit vector per text; a zero vector for a text with no known token (empty, or only [UNK]s)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, encoding in enumerate(self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            if not encoding.ids:
                continue
            ids = np.asarray(encoding.ids, dtype=np.int64)
            summed = self.scale[ids] @ self.table[ids].astype(np.float32)
            norm = float(np.linalg.norm(summed))
            if norm > 0.0:
                out[i] = summed / norm
        return out


class StaticEmbedder(Loaded[StaticModel]):
    name = "static:all-MiniLM-L6-v2"
    dim = 256
    min_similarity = 0.35
    """The protocol's; the static table is the router's alone and was not evaluated for knowledge search."""

    def __init__(self, model: StaticModel | None = None, *, path: Path = MODEL_DIR) -> None:
        super().__init__(model)
        self.path = path

    def _make(self) -> StaticModel:
        return StaticModel(self.path)

    def _broken(self, exc: Exception) -> tuple[str, str]:
        return (
            f"the static embedding in {self.path} could not be loaded ({type(exc).__name__}: {exc})",
            "Reinstall the bot (`pip install --force-reinstall .`)",
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        # On the event loop: a look-up costs less than the hop to a thread would.
        model = self._model or await self._loaded()
        vectors: list[list[float]] = model.encode(texts).tolist()
        return vectors

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embed(texts)
