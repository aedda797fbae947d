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

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.knowledge.embedders import LocalModel

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


# Abramowitz & Stegun 7.1.26 (error < 1.5e-7): BERT's GELU is erf-based, and NumPy has no erf.
_ERF_P = np.float32(0.3275911)
_ERF_A = tuple(np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))


def _gelu(x: Array) -> Array:
    """x * Phi(x), with Phi from the erf approximation above, in place on scratch arrays: written as a chain of
    expressions it made a dozen temporaries of the widest activation and took a quarter of the pass."""
    z = np.abs(x)
    z *= np.float32(1.0 / math.sqrt(2.0))
    t = z * _ERF_P
    t += 1.0
    np.reciprocal(t, out=t)
    tail = t * _ERF_A[0]
    for a in _ERF_A[1:]:
        tail += a
        tail *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    tail *= z
    tail *= 0.5  # now 1 - Phi(|x|)
    phi = np.where(x >= 0, 1.0 - tail, tail)
    phi *= x
    return phi


def _layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    centred: Array = x - x.mean(-1, keepdims=True)
    scale = np.sqrt(np.square(centred).mean(-1, keepdims=True) + np.float32(eps))
    centred /= scale
    centred *= weight
    centred += bias
    return centred


class MiniLM:
    """The encoder itself (synchronous; `LocalEmbedder` runs it off the event loop)."""

    def __init__(self, path: Path = MODEL_DIR, *, max_tokens: int = 256, threads: int = 1) -> None:
        from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
        from tokenizers import Tokenizer

        # NumPy's BLAS threads, for the whole process (BLAS has one setting): the bot serves many conversations at
        # once and runs one pass at a time for all of them; a second BLAS thread per pass spins against the event
        # loop's core, doubling a short message's CPU time; it only saves wall time on an idle machine
        # (bench/embedding.py).
        ThreadpoolController().limit(limits=threads, user_api="blas")
        self.config: dict[str, Any] = json.loads((path / "config.json").read_text())
        self.w = load_weights(path / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=self.config["pad_token_id"], pad_token="[PAD]")
        self.heads = int(self.config["num_attention_heads"])
        self.eps = float(self.config["layer_norm_eps"])
        self.dim = int(self.config["hidden_size"])

    def _dense(self, x: Array, name: str) -> Array:
        out: Array = x @ self.w[f"{name}.weight"].T
        out += self.w[f"{name}.bias"]
        return out

    def encode(self, texts: list[str], batch: int = 32) -> Array:
        # Sorting by length keeps padding, and so wasted work in attention, small within each batch.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch):
            ids = order[start : start + batch]
            out[ids] = self._encode_batch([texts[i] for i in ids])
        return out

    def _encode_batch(self, texts: list[str]) -> Array:
        encodings = self.tokenizer.encode_batch(texts)
        tokens = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=bool)
        w = self.w
        n, length = tokens.shape
        # Every step but attention works on each token alone, so it runs on the real tokens only, packed as one
        # (tokens, hidden) matrix: texts of 5 and 20 words padded together would otherwise cost twice the work.
        x = w["embeddings.word_embeddings.weight"][tokens[mask]]
        x += w["embeddings.position_embeddings.weight"][np.nonzero(mask)[1]]
        x += w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        head = self.dim // self.heads
        blocked = np.where(mask, np.float32(0.0), np.float32(-1e9))[:, None, None, :]
        padded = np.zeros((n, length, self.dim), dtype=np.float32)

        def split(t: Array, order: tuple[int, ...] = (0, 2, 1, 3)) -> Array:
            padded[mask] = t
            # Contiguous copies: NumPy's batched matmul is only fast (BLAS per slice) on contiguous stacks.
            return np.ascontiguousarray(padded.reshape(n, length, self.heads, head).transpose(order))

        for layer in range(int(self.config["num_hidden_layers"])):
            p = f"encoder.layer.{layer}"
            q = split(self._dense(x, f"{p}.attention.self.query"))
            q *= np.float32(1.0 / math.sqrt(head))
            k_t = split(self._dense(x, f"{p}.attention.self.key"), (0, 2, 3, 1))
            v = split(self._dense(x, f"{p}.attention.self.value"))
            scores = q @ k_t
            scores += blocked
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3)[mask].reshape(-1, self.dim)
            attended = self._dense(context, f"{p}.attention.output.dense")
            attended += x
            x = _layer_norm(
                attended,
                w[f"{p}.attention.output.LayerNorm.weight"],
                w[f"{p}.attention.output.LayerNorm.bias"],
                self.eps,
            )
            out = self._dense(_gelu(self._dense(x, f"{p}.intermediate.dense")), f"{p}.output.dense")
            out += x
            x = _layer_norm(out, w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"], self.eps)
        # Mean pooling over each text's own tokens: the packed rows are in text order.
        counts = mask.sum(1)
        pooled = np.add.reduceat(x, np.concatenate(([0], np.cumsum(counts)[:-1])), axis=0) / counts[:, None]
        pooled = pooled.astype(np.float32, copy=False)
        normed: Array = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), np.float32(1e-12))
        return normed


class LocalEmbedder(LocalModel[MiniLM]):
    name = f"local:{MODEL}"
    dim = 384
    min_similarity = 0.35

    def __init__(self, model: MiniLM | None = None, *, path: Path = MODEL_DIR) -> None:
        super().__init__(model)
        self.path = path

    def _make(self) -> MiniLM:
        return MiniLM(self.path)

    def _broken(self, exc: Exception) -> tuple[str, str]:
        return (
            f"the local model in {self.path} could not be loaded ({type(exc).__name__}: {exc})",
            "Reinstall the bot (`pip install --force-reinstall .`), or set EMBEDDINGS=openai with a provider",
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        model = await self._loaded()
        return await self._batcher.run(model.encode, texts)

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embed(texts)
