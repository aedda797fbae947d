"""The knowledge base in Postgres: idempotent ingestion and hybrid search.

Search runs a vector query (cosine distance on the collection's HNSW index) and a full-text query (the
question's words OR-ed, ranked by ts_rank_cd) and fuses the two rankings by reciprocal rank fusion, so an
exact product code (which embeddings blur) and a paraphrase (which shares no words) are both found.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.errors import AgentsError
from agents.knowledge.chunking import chunk_document
from agents.knowledge.documents import Document, find_documents, read_document
from agents.knowledge.embedders import Embedder
from db import models as m

log = logging.getLogger(__name__)

Mode = Literal["hybrid", "vector", "text"]
RRF_K = 60
TEXT_WEIGHT = 0.5
CANDIDATES = 40


class EmbedderMismatch(AgentsError):
    """The collection was built by another embedder; its vectors and the query's are not comparable."""


@dataclass(frozen=True)
class Hit:
    source: str
    title: str
    heading: str | None
    text: str
    score: float
    """The fused score (hybrid), cosine similarity (vector) or text rank (text)."""
    similarity: float | None
    """Cosine similarity of the passage to the question, when the vector search saw it."""
    collection: str

    @property
    def citation(self) -> str:
        where = f"{self.title} › {self.heading}" if self.heading else self.title
        link = f" <{self.source}>" if self.source.startswith(("http://", "https://")) else f" ({self.source})"
        return where + link


@dataclass(frozen=True)
class IngestReport:
    added: int
    replaced: int
    unchanged: int
    pruned: int
    chunks: int


class KnowledgeBase:
    def __init__(
        self, *, sessions: async_sessionmaker[AsyncSession], embedder: Embedder, text_weight: float = TEXT_WEIGHT
    ) -> None:
        self.sessions = sessions
        self.embedder = embedder
        self.text_weight = text_weight
        """The full-text ranking's weight in the fusion, the vector ranking's being 1 (see README for the
        evaluation that chose it)."""

    async def ensure_collection(self, collection: str) -> None:
        async with self.sessions() as s, s.begin():
            await s.execute(
                insert(m.KnowledgeCollection)
                .values(name=collection, embedder=self.embedder.name, dim=self.embedder.dim)
                .on_conflict_do_nothing()
            )
            await self._check(s, collection)
            # One partial HNSW index per dimension (the migration made 384 and 1536).
            dim = int(self.embedder.dim)
            await s.execute(
                text(
                    f"CREATE INDEX IF NOT EXISTS ix_kb_chunks_hnsw_{dim} ON kb_chunks "
                    f"USING hnsw ((embedding::vector({dim})) vector_cosine_ops) WHERE dim = {dim}"
                )
            )

    async def _check(self, s: AsyncSession, collection: str) -> None:
        row = await s.get(m.KnowledgeCollection, collection)
        if row is not None and (row.embedder, row.dim) != (self.embedder.name, self.embedder.dim):
            raise EmbedderMismatch(
                f"collection {collection!r} was embedded with {row.embedder} ({row.dim} dimensions), but the "
                f"configured embedder is {self.embedder.name} ({self.embedder.dim}). Re-embed it with "
                f"`python -m bot kb delete --collection {collection}` and then `python -m bot kb ingest PATH... "
                f"--collection {collection}`, or configure the embedder it was built with."
            )

    async def ingest(
        self,
        paths: Sequence[Path],
        *,
        collection: str,
        prune: bool = False,
        root: Path | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> IngestReport:
        """Unchanged documents (same content hash) are skipped, changed ones replaced; with `prune`, documents
        of the collection that are no longer among `paths` are removed."""
        await self.ensure_collection(collection)
        files = find_documents(list(paths))
        added = replaced = unchanged = chunks = 0
        seen: set[str] = set()
        for index, path in enumerate(files):
            source = str(path.relative_to(root)) if root else str(path)
            seen.add(source)
            document = read_document(path, source=source)
            outcome, count = await self._ingest_one(document, collection)
            added += outcome == "added"
            replaced += outcome == "replaced"
            unchanged += outcome == "unchanged"
            chunks += count
            if progress:
                progress(index + 1, len(files), source)
        pruned = await self._prune(collection, seen) if prune else 0
        return IngestReport(added, replaced, unchanged, pruned, chunks)

    async def _ingest_one(self, document: Document, collection: str) -> tuple[str, int]:
        async with self.sessions() as s:
            existing = await s.scalar(
                select(m.KnowledgeDocument).where(
                    m.KnowledgeDocument.collection == collection, m.KnowledgeDocument.source == document.source
                )
            )
        if existing is not None and existing.content_hash == document.content_hash:
            return "unchanged", 0
        pieces = chunk_document(document)
        vectors = await self.embedder.embed([c.embedding_text for c in pieces]) if pieces else []
        async with self.sessions() as s, s.begin():
            if existing is not None:
                await s.execute(delete(m.KnowledgeDocument).where(m.KnowledgeDocument.id == existing.id))
            doc = m.KnowledgeDocument(
                collection=collection, source=document.source, title=document.title, content_hash=document.content_hash
            )
            s.add(doc)
            await s.flush()
            if pieces:
                await s.execute(
                    insert(m.KnowledgeChunk),
                    [
                        {
                            "document_id": doc.id,
                            "collection": collection,
                            "ordinal": c.ordinal,
                            "title": c.title,
                            "heading": c.heading,
                            "text": c.text,
                            "dim": self.embedder.dim,
                            "embedding": vector,
                        }
                        for c, vector in zip(pieces, vectors, strict=True)
                    ],
                )
        return ("replaced" if existing is not None else "added"), len(pieces)

    async def _prune(self, collection: str, keep: set[str]) -> int:
        async with self.sessions() as s, s.begin():
            result = await s.execute(
                delete(m.KnowledgeDocument)
                .where(m.KnowledgeDocument.collection == collection, m.KnowledgeDocument.source.not_in(keep))
                .returning(m.KnowledgeDocument.id)
            )
            return len(result.all())

    async def search(
        self, query: str, *, collections: Sequence[str] = (), k: int = 5, mode: Mode = "hybrid"
    ) -> list[Hit]:
        async with self.sessions() as s:
            for collection in collections:
                await self._check(s, collection)
            names = list(collections) or list(
                (
                    await s.scalars(
                        select(m.KnowledgeCollection.name).where(
                            m.KnowledgeCollection.embedder == self.embedder.name,
                            m.KnowledgeCollection.dim == self.embedder.dim,
                        )
                    )
                ).all()
            )
            if not names:
                return []
            vector_ranked = await self._vector(s, query, names) if mode != "text" else []
            text_ranked = await self._text(s, query, names) if mode != "vector" else []
        similarity = {row[0]: float(row[-1]) for row in vector_ranked}
        rows = {row[0]: row for row in [*vector_ranked, *text_ranked]}
        scores: dict[int, float] = {}
        if mode == "vector":
            scores = dict(similarity)
        elif mode == "text":
            scores = {row[0]: float(row[-1]) for row in text_ranked}
        else:
            for weight, ranking in ((1.0, vector_ranked), (self.text_weight, text_ranked)):
                for rank, row in enumerate(ranking):
                    scores[row[0]] = scores.get(row[0], 0.0) + weight / (RRF_K + rank + 1)
        best = sorted(scores, key=lambda chunk_id: -scores[chunk_id])[:k]
        return [
            Hit(
                source=rows[i][1],
                title=rows[i][2],
                heading=rows[i][3],
                text=rows[i][4],
                score=scores[i],
                similarity=similarity.get(i),
                collection=rows[i][5],
            )
            for i in best
        ]

    async def _vector(self, s: AsyncSession, query: str, collections: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        [vector] = await self.embedder.embed([query])
        dim = int(self.embedder.dim)
        # A cached generic plan walks the HNSW index over every collection and filters afterwards, losing
        # candidates (to none, beside a large collection): plan per query, and let the index look further.
        await s.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
        await s.execute(text("SET LOCAL hnsw.ef_search = 100"))
        distance = f"(c.embedding::vector({dim}) <=> CAST(:q AS vector({dim})))"
        result = await s.execute(
            text(
                f"SELECT c.id, d.source, c.title, c.heading, c.text, c.collection, 1 - {distance} AS similarity "
                "FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id "
                f"WHERE c.dim = {dim} AND c.collection = ANY(:collections) "
                f"ORDER BY {distance} LIMIT {CANDIDATES}"
            ),
            {"q": str(vector), "collections": collections},
        )
        return [tuple(r) for r in result]

    async def _text(self, s: AsyncSession, query: str, collections: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        # The question's words OR-ed: a customer's sentence rarely has every word of the passage that answers it.
        result = await s.execute(
            text(
                "WITH q AS (SELECT to_tsquery('english', replace(plainto_tsquery('english', :query)::text, '&', '|'))"
                " AS tsq) "
                "SELECT c.id, d.source, c.title, c.heading, c.text, c.collection, ts_rank_cd(c.tsv, q.tsq) AS rank "
                "FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id, q "
                "WHERE c.collection = ANY(:collections) AND c.tsv @@ q.tsq "
                f"ORDER BY rank DESC LIMIT {CANDIDATES}"
            ),
            {"query": query, "collections": collections},
        )
        return [tuple(r) for r in result]

    async def stats(self) -> list[dict[str, object]]:
        async with self.sessions() as s:
            rows = await s.execute(
                select(
                    m.KnowledgeCollection.name,
                    m.KnowledgeCollection.embedder,
                    m.KnowledgeCollection.dim,
                    select(func.count())
                    .where(m.KnowledgeDocument.collection == m.KnowledgeCollection.name)
                    .scalar_subquery(),
                    select(func.count())
                    .where(m.KnowledgeChunk.collection == m.KnowledgeCollection.name)
                    .scalar_subquery(),
                ).order_by(m.KnowledgeCollection.name)
            )
            return [
                {"collection": n, "embedder": e, "dim": d, "documents": docs, "chunks": chunks}
                for n, e, d, docs, chunks in rows
            ]

    async def sources(self) -> list[str]:
        async with self.sessions() as s:
            rows = await s.execute(
                select(m.KnowledgeDocument.collection, m.KnowledgeDocument.source).order_by(
                    m.KnowledgeDocument.collection, m.KnowledgeDocument.source
                )
            )
            return [f"{collection}: {source}" for collection, source in rows]

    async def delete_collection(self, collection: str) -> bool:
        async with self.sessions() as s, s.begin():
            result = await s.execute(
                delete(m.KnowledgeCollection)
                .where(m.KnowledgeCollection.name == collection)
                .returning(m.KnowledgeCollection.name)
            )
            return result.first() is not None
