"""Embedders: the OpenAI embeddings API when a provider is configured, a local model otherwise."""

from __future__ import annotations

from typing import Protocol

import openai

from agents.errors import ProviderError


class Embedder(Protocol):
    name: str
    """Identifies the model; recorded per collection, so a query with another embedder is refused."""
    dim: int

    async def embed(self, texts: list[str]) -> list[list[float]]: ...


class OpenAIEmbedder:
    def __init__(self, *, client: openai.AsyncOpenAI, model: str, dim: int, batch: int = 128) -> None:
        self.client = client
        self.model = model
        self.name = f"openai:{model}"
        self.dim = dim
        self.batch = batch

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        try:
            for start in range(0, len(texts), self.batch):
                response = await self.client.embeddings.create(
                    model=self.model, input=texts[start : start + self.batch], encoding_format="float"
                )
                vectors += [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
        except openai.OpenAIError as exc:
            raise ProviderError("embeddings", str(exc)) from exc
        if vectors and len(vectors[0]) != self.dim:
            raise ProviderError(
                "embeddings", f"{self.model} returned {len(vectors[0])} dimensions, expected {self.dim}"
            )
        return vectors
