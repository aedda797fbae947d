"""The English local embedder (EMBEDDINGS=local-english): all-MiniLM-L6-v2, shipped inside this package (`minilm/`,
int8 weights), run with NumPy. The default local embedder is the multilingual one (`agents.knowledge.multilingual`).

Nothing is downloaded at run time, and there is no torch: the model is a 6-layer BERT, whose forward pass
is a few matrix products that NumPy's BLAS does about as fast as torch on a CPU, in a fraction of the memory
and install size (README "Local embeddings" has the figures and the alternatives measured). Tokenisation is
the model's own `tokenizer.json` through the `tokenizers` library. Output: mean-pooled, L2-normalised
384-dimensional vectors, as sentence-transformers computes them (to a cosine of about 0.99: the weights
are int8, see `scripts/quantize_minilm.py`).
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.knowledge.embedders import Unavailable

Array = NDArray[np.float32]
MODEL = "all-MiniLM-L6-v2"


MODEL_DIR = Path(__file__).resolve().parent / "minilm"


def load_weights(path: Path) -> dict[str, Array]:
    """float32 weights from the file, int8 matrices (`NAME.int8` with `NAME.scale` per row) expanded."""
    from safetensors.numpy import load_file

    stored = load_file(str(path))
    weights: dict[str, Array] = {}
    for name, value in stored.items():
        if name.endswith(".int8"):
            base = name.removesuffix(".int8")
            weights[base] = value.astype(np.float32) * stored[f"{base}.scale"][:, None]
        elif not name.endswith(".scale"):
            weights[name] = value.astype(np.float32)
    return weights


def _erf(x: Array) -> Array:
    # Abramowitz & Stegun 7.1.26 (error < 1.5e-7): BERT's GELU is erf-based, and NumPy has no erf.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    out: Array = (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)
    return out


def _gelu(x: Array) -> Array:
    return (0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))).astype(np.float32)


def _layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: Array = ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(np.float32)
    return out


class MiniLM:
    """The encoder itself (synchronous; `LocalEmbedder` runs it off the event loop)."""

    def __init__(self, path: Path = MODEL_DIR, *, max_tokens: int = 256) -> None:
        from tokenizers import Tokenizer

        self.config: dict[str, Any] = json.loads((path / "config.json").read_text())
        self.w = load_weights(path / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=self.config["pad_token_id"], pad_token="[PAD]")
        self.heads = int(self.config["num_attention_heads"])
        self.eps = float(self.config["layer_norm_eps"])
        self.dim = int(self.config["hidden_size"])

    def _dense(self, x: Array, name: str) -> Array:
        # As one 2-D product: NumPy hands that to BLAS, while a 3-D one by a 2-D matrix loops slowly.
        flat = x.reshape(-1, x.shape[-1]) @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]
        return flat.reshape(*x.shape[:-1], -1).astype(np.float32, copy=False)

    def encode(self, texts: list[str], batch: int = 32) -> Array:
        # Sorting by length keeps padding, and so wasted work, small within each batch.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch):
            ids = order[start : start + batch]
            out[ids] = self._encode_batch([texts[i] for i in ids])
        return out

    def _encode_batch(self, texts: list[str]) -> Array:
        encodings = self.tokenizer.encode_batch(texts)
        tokens = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        w = self.w
        n, length = tokens.shape
        x = w["embeddings.word_embeddings.weight"][tokens] + w["embeddings.position_embeddings.weight"][:length]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        head = self.dim // self.heads
        blocked = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for layer in range(int(self.config["num_hidden_layers"])):
            p = f"encoder.layer.{layer}"

            def split(t: Array, order: tuple[int, ...] = (0, 2, 1, 3)) -> Array:
                # Contiguous copies: NumPy's batched matmul is only fast (BLAS per slice) on contiguous stacks.
                return np.ascontiguousarray(t.reshape(n, length, self.heads, head).transpose(order))

            q = split(self._dense(x, f"{p}.attention.self.query"))
            k_t = split(self._dense(x, f"{p}.attention.self.key"), (0, 2, 3, 1))
            v = split(self._dense(x, f"{p}.attention.self.value"))
            scores = (q @ k_t) / np.float32(math.sqrt(head)) + blocked
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attention = scores / scores.sum(-1, keepdims=True)
            context = (attention @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dim)
            x = _layer_norm(
                self._dense(context, f"{p}.attention.output.dense") + x,
                w[f"{p}.attention.output.LayerNorm.weight"],
                w[f"{p}.attention.output.LayerNorm.bias"],
                self.eps,
            )
            hidden = _gelu(self._dense(x, f"{p}.intermediate.dense"))
            x = _layer_norm(
                self._dense(hidden, f"{p}.output.dense") + x,
                w[f"{p}.output.LayerNorm.weight"],
                w[f"{p}.output.LayerNorm.bias"],
                self.eps,
            )
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        out: Array = (pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)).astype(np.float32)
        return out


class LocalEmbedder:
    name = f"local:{MODEL}"
    dim = 384
    min_similarity = 0.35

    def __init__(self, model: MiniLM | None = None, *, path: Path = MODEL_DIR) -> None:
        self._model = model
        self.path = path
        self._lock = asyncio.Lock()

    async def load(self) -> Unavailable | None:
        """Load the model now: None when it works, else why not (a damaged or partial install)."""
        try:
            await self._loaded()
        except Exception as exc:  # any failure to load leaves the bot on full-text search, not down
            return Unavailable(
                self.name,
                "broken_model",
                f"the local model in {self.path} could not be loaded ({type(exc).__name__}: {exc})",
                "Reinstall the bot (`pip install --force-reinstall .`), or set EMBEDDINGS=openai with a provider",
            )
        return None

    async def _loaded(self) -> MiniLM:
        async with self._lock:
            if self._model is None:
                self._model = await asyncio.to_thread(MiniLM, self.path)
            return self._model

    async def embed(self, texts: list[str]) -> list[list[float]]:
        model = await self._loaded()
        vectors = await asyncio.to_thread(model.encode, texts)
        return [[float(v) for v in row] for row in vectors]

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embed(texts)
