"""Embedders: a provider's embeddings API (any OpenAI-compatible one), or the local model.

An embedder is optional: `probe` finds out at start-up whether the configured one works and how wide its
vectors are. When it does not (the local model is missing, the provider has no embeddings endpoint or does not
serve the model), the knowledge base keeps answering by full-text search and says why (`Unavailable`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np
import openai

from agents.errors import ProviderError
from agents.knowledge.batching import Batcher

log = logging.getLogger(__name__)


class Embedder(Protocol):
    name: str
    """Identifies the model; recorded per collection, so a query with another embedder is refused."""
    dim: int
    """Vector width; for a provider's model, learned from its first answer (`probe`)."""
    min_similarity: float
    """The cosine below which a passage counts as unrelated to a question (KB_MIN_SIMILARITY, when unset): each
    model spreads its similarities differently (docs/knowledge.md has the evaluation that chose each)."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Passages, as stored."""
        ...

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        """Questions: some models (the e5 family) embed a question otherwise than the passage that answers it."""
        ...


Why = Literal["no_embeddings", "refused", "unreachable", "error", "lost", "broken_model", "disabled"]
"""no_embeddings: the provider has no embeddings endpoint, or does not serve the model (404, 405); refused: the
key (401, 403); unreachable: no answer, 429 or 5xx at start-up; error: another refusal; lost: a request failed
after the embedder had worked; broken_model: the local model's files do not load; disabled: EMBEDDINGS=none."""


@dataclass(frozen=True)
class Unavailable:
    """Why the configured embedder cannot embed, and what the operator can do about it."""

    name: str
    why: Why
    problem: str
    fix: str

    @property
    def retry(self) -> bool:
        """A failure that may pass: probed again once a minute."""
        return self.why in ("unreachable", "lost")

    def __str__(self) -> str:
        return f"{self.name}: {self.problem}. {self.fix}"


M = TypeVar("M")


class Loaded(Generic[M]):
    """A model of this process, loaded once (at its first use or at `load`, off the event loop): a broken install
    says so as an `Unavailable` instead of taking the bot down."""

    name: str

    def __init__(self, model: M | None = None) -> None:
        self._model = model
        self._lock = asyncio.Lock()

    def _make(self) -> M:
        """Load the model (run in a thread)."""
        raise NotImplementedError

    def _broken(self, exc: Exception) -> tuple[str, str]:
        """What failed to load, and what the operator can do: `Unavailable`'s problem and fix."""
        raise NotImplementedError

    async def _in_thread(self, make: Callable[[], M]) -> M:
        """Where loading runs: a thread of the default executor."""
        return await asyncio.to_thread(make)

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory: loaded at the first embedding or `load`."""
        return self._model is not None

    async def load(self) -> Unavailable | None:
        """Load the model now: None when it works, else why not (a damaged or partial install)."""
        try:
            await self._loaded()
        except Exception as exc:  # any failure to load leaves the bot without this model, not down
            return Unavailable(self.name, "broken_model", *self._broken(exc))
        return None

    async def _loaded(self) -> M:
        async with self._lock:
            if self._model is None:
                self._model = await self._in_thread(self._make)
            return self._model


class LocalModel(Loaded[M]):
    """A neural model run in this process (agents.knowledge.local, .multilingual; MiniLM about 55 MB resident): the
    texts that arrive together share a forward pass (`Batcher`), on the model's own thread, where it loads too."""

    def __init__(self, model: M | None = None) -> None:
        super().__init__(model)
        self._batcher = Batcher(name=self.name)

    @property
    def passes(self) -> int:
        """Forward passes run so far: the texts that arrive together share one (`agents.knowledge.batching`)."""
        return self._batcher.passes

    async def _in_thread(self, make: Callable[[], M]) -> M:
        def loaded_and_trimmed() -> M:
            model = make()
            release_freed_memory()
            return model

        return await self._batcher.in_thread(loaded_and_trimmed)

    def close(self) -> None:
        """Stop the model's thread (the model stays loaded)."""
        self._batcher.close()


def release_freed_memory() -> None:
    """Hand the pages malloc keeps after a load's temporaries back to the system (glibc keeps freed memory in each
    thread's arena, and loading runs in a worker thread): tens of MB of resident memory otherwise never used again."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
        return
    trim(0)


class OpenAIEmbedder:
    """Any OpenAI-compatible `/embeddings` endpoint. `dimensions`, when set, is asked of the model (OpenAI's
    text-embedding-3 models shorten their vectors); otherwise the width is whatever the model returns."""

    def __init__(
        self,
        *,
        client: openai.AsyncOpenAI,
        model: str,
        dimensions: int | None = None,
        batch: int = 128,
        query_veil: Callable[[str], str] | None = None,
    ) -> None:
        self.client = client
        self.query_veil = query_veil
        """What a question becomes before it leaves (agents.redaction); passages, the operator's, go as they are."""
        self.model = model
        self.name = f"openai:{model}"
        self.min_similarity = 0.35
        self.dimensions = dimensions
        self.dim = dimensions or 0
        self.batch = batch

    async def close(self) -> None:
        await self.client.close()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        try:
            for start in range(0, len(texts), self.batch):
                response = await self.client.embeddings.create(
                    model=self.model,
                    input=texts[start : start + self.batch],
                    encoding_format="float",
                    dimensions=self.dimensions if self.dimensions else openai.omit,
                )
                vectors += [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
        except openai.OpenAIError as exc:
            raise ProviderError("embeddings", str(exc)) from exc
        if vectors and not self.dim:
            self.dim = len(vectors[0])
        if odd := next((len(v) for v in vectors if len(v) != self.dim), None):
            raise ProviderError("embeddings", f"{self.model} returned a vector of {odd} dimensions, not {self.dim}")
        return vectors

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embed([self.query_veil(t) for t in texts] if self.query_veil is not None else texts)


_TRANSIENT = (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError, openai.InternalServerError)


PROBE_TIMEOUT_S = 5.0


async def probe(embedder: OpenAIEmbedder, *, where: str) -> Unavailable | None:
    """Embed one short text, without retries and within a few seconds (start-up, and later probes, must not
    wait for the SDK's 30-second timeouts): None when the provider answers, and `embedder.dim` is then known;
    else why not. `where` names the endpoint for the operator (its base URL, without credentials)."""
    quick = OpenAIEmbedder(
        client=embedder.client.with_options(timeout=PROBE_TIMEOUT_S, max_retries=0),
        model=embedder.model,
        dimensions=embedder.dimensions,
    )
    try:
        await quick.embed(["dimension probe"])
    except ProviderError as exc:
        cause = exc.__cause__
        status = getattr(cause, "status_code", None)
        why: Why
        if status in (404, 405):
            why, problem = "no_embeddings", f"{where} has no embeddings endpoint, or does not serve the model"
            problem += f" {embedder.model!r}"
            fix = (
                "Set EMBEDDINGS_MODEL to an embedding model it serves (Ollama: `ollama pull nomic-embed-text`), "
                "point EMBEDDINGS_BASE_URL (and EMBEDDINGS_API_KEY) at a server that has one, or set "
                "EMBEDDINGS=local for the model shipped with the bot"
            )
        elif status in (401, 403):
            why, problem = "refused", f"{where} refused the key for embeddings (HTTP {status})"
            fix = "Check EMBEDDINGS_API_KEY (or OPENAI_API_KEY, which it falls back to), or set EMBEDDINGS=local"
        elif isinstance(cause, _TRANSIENT):
            why, problem = "unreachable", f"{where} did not answer an embeddings request ({exc})"
            fix = "The bot tries again every minute; EMBEDDINGS=local avoids the dependency"
        else:
            why, problem = "error", f"{where} failed an embeddings request ({exc})"
            fix = "Check EMBEDDINGS_MODEL and EMBEDDINGS_DIM, or set EMBEDDINGS=local"
        return Unavailable(embedder.name, why, problem, fix)
    embedder.dim = quick.dim
    return None


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Precomputed:
    """Vectors made earlier by `embedder` (shipped with the sample knowledge), looked up by text; texts not
    among them are embedded as usual. `load` checks a few against the embedder first, so vectors of another
    model, or of a changed one, are never mixed in."""

    def __init__(self, embedder: Embedder, vectors: dict[str, list[float]]) -> None:
        self.embedder = embedder
        self.name = embedder.name
        self.dim = embedder.dim
        self.min_similarity = embedder.min_similarity
        self.vectors = vectors
        self.misses = 0

    @classmethod
    async def load(cls, embedder: Embedder, path: Path, *, check: int = 3) -> Precomputed | None:
        try:
            shipped_name, keys, vectors, texts = await asyncio.to_thread(_read_precomputed, path)
        except FileNotFoundError:
            return None
        except Exception as exc:  # a damaged file (or a Git LFS pointer) costs embedding, never the start-up
            log.warning("cannot read the shipped vectors in %s (%s): embedding instead", path, exc)
            return None
        if shipped_name != embedder.name or vectors.shape[1] != embedder.dim:
            return None
        table = dict(zip(keys, vectors.tolist(), strict=True))
        texts = texts[:check]
        fresh = np.array(await embedder.embed(texts), dtype=np.float32)
        shipped = np.array([table[text_key(t)] for t in texts], dtype=np.float32)
        cosines = (fresh * shipped).sum(axis=1) / (
            np.linalg.norm(fresh, axis=1) * np.linalg.norm(shipped, axis=1) + 1e-12
        )
        if float(cosines.min()) < 0.99:
            log.warning(
                "the shipped vectors do not match %s (cosine %.3f): embedding instead",
                embedder.name,
                float(cosines.min()),
            )
            return None
        return cls(embedder, table)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in texts if text_key(t) not in self.vectors]
        if missing:
            self.misses += len(missing)
            for text, vector in zip(missing, await self.embedder.embed(missing), strict=True):
                self.vectors[text_key(text)] = vector
        return [self.vectors[text_key(t)] for t in texts]

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embedder.embed_query(texts)


def _read_precomputed(path: Path) -> tuple[str, list[str], np.ndarray, list[str]]:
    with np.load(path) as stored:
        keys = [str(k) for k in stored["keys"]]
        texts = [str(t) for t in stored["check_texts"]]
        return str(stored["embedder"]), keys, stored["vectors"].astype(np.float32), texts


def save_precomputed(path: Path, embedder_name: str, texts: list[str], vectors: list[list[float]]) -> None:
    """Write what `Precomputed.load` reads: the vectors by text key, and a few texts to check them by."""
    spread = [texts[i] for i in np.linspace(0, len(texts) - 1, num=min(5, len(texts)), dtype=int)]
    np.savez_compressed(
        path,
        embedder=np.array(embedder_name),
        keys=np.array([text_key(t) for t in texts]),
        vectors=np.array(vectors, dtype=np.float32),
        check_texts=np.array(spread),
    )
