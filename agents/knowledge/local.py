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


TABLE = "embeddings.word_embeddings.weight"
"""The token embeddings (30522 x 384): kept int8 and mapped from the file, a batch's rows expanded as it looks them up;
expanded whole they would take 47 MB for the few thousand rows customers' words ever touch."""
_DTYPES = {"F32": np.float32, "I8": np.int8}


class Weights:
    """The model's weights: every matrix but the token table expanded to float32 in one block of memory of its own
    (about 43 MB, mapped apart from the malloc heap, so the thread that loads it leaves no arena of that size behind),
    each layer's query, key and value matrices stacked as one (`attention.self.qkv`: one product instead of three);
    the token table int8 (`NAME.int8`, with `NAME.scale` per row) as stored."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as file:
            size = int.from_bytes(file.read(8), "little")
            header: dict[str, Any] = json.loads(file.read(size))
        header.pop("__metadata__", None)
        start = 8 + size

        def mapped(name: str) -> NDArray[Any]:
            spec = header[name]
            begin = spec["data_offsets"][0]
            dtype = np.dtype(_DTYPES[spec["dtype"]])
            return np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=tuple(spec["shape"]))

        table = mapped(f"{TABLE}.int8")
        self.table: NDArray[np.int8] = table
        self.table_scale: Array = np.array(mapped(f"{TABLE}.scale"))
        names = sorted({n.removesuffix(".int8").removesuffix(".scale") for n in header} - {TABLE})
        fused = [n for n in names if ".attention.self." in n]
        shapes = {n: tuple(header[n if n in header else f"{n}.int8"]["shape"]) for n in names}
        for layer in {n.split(".attention.self.")[0] for n in fused}:
            for kind in ("weight", "bias"):
                parts = [f"{layer}.attention.self.{p}.{kind}" for p in ("query", "key", "value")]
                first = shapes[parts[0]]
                shapes[f"{layer}.attention.self.qkv.{kind}"] = (3 * first[0], *first[1:])
                for part in parts:
                    del shapes[part]
        block = np.empty(sum(math.prod(s) for s in shapes.values()), dtype=np.float32)
        self.w: dict[str, Array] = {}
        offset = 0
        for name, shape in shapes.items():
            self.w[name] = block[offset : offset + math.prod(shape)].reshape(shape)
            offset += math.prod(shape)
        for name in names:
            layer, _, rest = name.partition(".attention.self.")
            if rest:
                part, kind = rest.split(".")
                whole = self.w[f"{layer}.attention.self.qkv.{kind}"]
                third = whole.shape[0] // 3
                dest = whole[("query", "key", "value").index(part) * third :][:third]
            else:
                dest = self.w[name]
            if name in header:
                dest[...] = mapped(name)
            else:
                np.multiply(mapped(f"{name}.int8"), mapped(f"{name}.scale")[:, None], out=dest)

    def tokens(self, ids: NDArray[np.int64]) -> Array:
        """The token embeddings of `ids`, expanded from int8."""
        rows: Array = self.table[ids].astype(np.float32)
        rows *= self.table_scale[ids, None]
        return rows


# Tanh approximation of BERT's erf-based GELU (NumPy has no erf): within 5e-4 of it, far inside the int8 weights'
# own error, in a third of the passes over the widest activation that the erf series took.
_GELU_A = np.float32(0.044715)
_GELU_B = np.float32(math.sqrt(2.0 / math.pi))


def _gelu(x: Array) -> Array:
    """x * Phi(x), in place on `x` (the intermediate activation, used once)."""
    t = np.square(x)
    t *= _GELU_A
    t += 1.0
    t *= x
    t *= _GELU_B
    np.tanh(t, out=t)
    t += 1.0
    t *= 0.5
    x *= t
    return x


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
        self.weights = Weights(path / "model.safetensors")
        self.w = self.weights.w
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
        return self.encode_ids(tokens, mask)

    def encode_ids(self, tokens: NDArray[np.int64], mask: NDArray[Any]) -> Array:
        """Token ids already made (with [CLS] and [SEP]; `mask` false on padding): `scripts/distil_minilm.py` runs
        each vocabulary entry alone, which no text tokenises to."""
        w = self.w
        n, length = tokens.shape
        # Every step but attention works on each token alone, so it runs on the real tokens only, packed as one
        # (tokens, hidden) matrix: texts of 5 and 20 words padded together would otherwise cost twice the work.
        x = self.weights.tokens(tokens[mask])
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
            qkv = self._dense(x, f"{p}.attention.self.qkv")
            q = split(qkv[:, : self.dim])
            q *= np.float32(1.0 / math.sqrt(head))
            k_t = split(qkv[:, self.dim : 2 * self.dim], (0, 2, 3, 1))
            v = split(qkv[:, 2 * self.dim :])
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
