"""The knowledge base in Postgres: idempotent ingestion, all or nothing, and hybrid search.

Search runs a vector query (cosine distance on the collection's HNSW index) and a full-text query (the
question's words, all of them first, then fewer) and fuses the two rankings by reciprocal rank fusion (a
full-text place weighted by the share of the question's words the passage holds), so that an
exact product code (which embeddings blur) and a paraphrase (which shares no words) are both found.

The embedder is optional. While it does not work (`Unavailable`), documents are stored without vectors and
every search is full text; a collection embedded by another model than the configured one is searched by
full text too. `status()` says which, and why; `backfill()` embeds what was stored without vectors once the
embedder works.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.errors import AgentsError, ProviderError
from agents.knowledge.chunking import Chunk, chunk_document
from agents.knowledge.documents import SUFFIXES, Document, find_documents
from agents.knowledge.embedders import Embedder, Unavailable
from agents.knowledge.identifiers import in_document, in_question
from agents.knowledge.readers import Unreadable, read_file

log = logging.getLogger(__name__)

Mode = Literal["hybrid", "vector", "text"]
RRF_K = 60
TEXT_WEIGHT = 0.75
MATCH_POWER = 2
"""A full-text place counts in the fusion by the share of the question's words the passage holds, to this power:
the looser steps (half of the words, any of them) fill the ranking with passages that share a word or two, which
should not outvote a passage the vector search ranks well (see README for the evaluation that chose both)."""
CANDIDATES = 40
MAX_TERMS = 64
"""The most word combinations a "at least m of the words" query may OR (beyond, that step is skipped)."""
RANKED_AT_MOST = 300
"""The most passages one full-text query ranks: ranking and fetching cost about 30 µs a passage, and a few common words
match most of a large collection. Beyond it, those ranked are the first found, not the best (rare: the
stricter queries come first, and the vector ranking is fused with this one)."""
ENOUGH_TEXT = 10
"""When all the question's words (AND) find fewer passages than this, any of them (OR) are searched too."""
SCAN_TUPLES = 20_000
"""How many index entries an iterative HNSW scan may visit to fill a filtered query (pgvector's default)."""
EF_SEARCH = 100
"""The HNSW search's candidate list (pgvector's default is 40): more than CANDIDATES, for recall."""
SUPERSEDED_WEIGHT = 0.5
"""A superseded document's passages score this share of what they would (see README for the evaluation that
chose it): below the current page on the same subject, still found when the question is about the old one."""
NEAREST_AT_WORST = 2
"""The passage nearest to the question in meaning ranks at worst here (after any naming its identifiers): the
full-text ranking adds exact words, and a few words shared by many passages (a stem such as "charg" in both
"charge" and "charging") should not push the best match in meaning out of the few the agent reads. Only a current
passage that full text found too (it holds some of the question's words) is lifted (see README, "Hybrid search",
for the evaluation that chose it)."""
REPROBE_S = 60.0
REMEMBERED_QUERIES = 256
"""How many query vectors a knowledge base keeps (384 floats each: about 3 MB as Python lists)."""


class EmbedderMismatch(AgentsError):
    """The collection was built by another embedder; its vectors and the query's are not comparable."""


class IngestFailed(AgentsError):
    """An ingestion that changed nothing: a file could not be read, there was none to read, or the embedder failed
    (`ingest(require_vectors=True)`)."""

    def __init__(self, path: Path | None, why: str) -> None:
        super().__init__(f"{path}: {why}" if path is not None else why)
        self.path = path
        """The file that failed; None when the failure is not one file's."""
        self.why = why


@dataclass(frozen=True)
class Hit:
    source: str
    title: str
    heading: str | None
    text: str
    score: float
    """The fused score (hybrid), cosine similarity (vector) or 1 / place in the full-text ranking (text). Hybrid hits
    come in score order but for passages naming the question's identifiers (first) and the one nearest in meaning
    (`NEAREST_AT_WORST`)."""
    similarity: float | None
    """Cosine similarity of the passage to the question, when the vector search saw it."""
    collection: str
    vector_searched: bool = True
    """False when the passage could only be searched by full text (no working embedder, a collection embedded
    by another model, or a passage stored without a vector): there is no similarity to judge it by."""
    text_match: float | None = None
    """The share of the question's words (stemmed) that the passage contains, when full text found it."""
    superseded: bool = False
    """Its document says it no longer applies (an older policy, a page replaced by another)."""

    @property
    def citation(self) -> str:
        where = f"{self.title} › {self.heading}" if self.heading else self.title
        where += " (superseded)" if self.superseded else ""
        link = f" <{self.source}>" if self.source.startswith(("http://", "https://")) else f" ({self.source})"
        return where + link


@dataclass(frozen=True)
class CollectionStatus:
    name: str
    embedder: str
    dim: int | None
    vector_search: bool
    problem: str | None
    """Why the collection is searched by full text only, with the fix."""


@dataclass(frozen=True)
class KnowledgeStatus:
    embedder: str
    dim: int | None
    unavailable: Unavailable | None
    collections: tuple[CollectionStatus, ...]
    unembedded: int = 0
    """Passages stored without vectors (searched by full text until embedded)."""

    @property
    def search(self) -> Literal["hybrid", "full-text", "mixed", "empty"]:
        vector = {c.vector_search for c in self.collections}
        return "empty" if not vector else "mixed" if len(vector) == 2 else "hybrid" if True in vector else "full-text"

    @property
    def problems(self) -> list[str]:
        return [str(self.unavailable)] if self.unavailable else [c.problem for c in self.collections if c.problem]


@dataclass(frozen=True)
class IngestReport:
    added: int
    replaced: int
    unchanged: int
    pruned: int
    chunks: int


class KnowledgeBase:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        embedder: Embedder,
        unavailable: Unavailable | None = None,
        reprobe: Callable[[], Awaitable[Unavailable | None]] | None = None,
        reprobe_every_s: float = REPROBE_S,
        text_weight: float = TEXT_WEIGHT,
        remembered_queries: int = REMEMBERED_QUERIES,
        nearest_at_worst: int | None = NEAREST_AT_WORST,
    ) -> None:
        self.sessions = sessions
        self.embedder = embedder
        self.unavailable = unavailable
        """Set while the embedder does not work: documents are then stored without vectors, searched by text."""
        self._reprobe = reprobe
        self._reprobe_every_s = reprobe_every_s
        self._next_probe = time.monotonic() + reprobe_every_s
        self._background: asyncio.Task[None] | None = None
        self._backfilling = asyncio.Lock()
        self.text_weight = text_weight
        """The full-text ranking's weight in the fusion, the vector ranking's being 1 (see README for the
        evaluation that chose it)."""
        self.remembered_queries = remembered_queries
        self.nearest_at_worst = nearest_at_worst
        """Where the passage nearest in meaning ranks at worst in a hybrid search (None: by its fused score)."""
        self._query_vectors: OrderedDict[str, list[float]] = OrderedDict()
        """The vectors of the latest queries, least recently used first (bounded by `remembered_queries`)."""
        self._iterative: bool | None = None
        """Whether pgvector (0.8 or later) scans HNSW iteratively; asked once, at the first vector search."""

    # --- the embedder's state: requests never wait for probes or backfills, which run in the background ---

    def _embedder_works(self) -> bool:
        """Whether vectors can be made now. A failure that may pass is probed again in the background, at most
        once per `reprobe_every_s`; once the embedder answers, what was stored without vectors is embedded."""
        if self.unavailable is None:
            return True
        due = self.unavailable.retry and self._reprobe is not None and time.monotonic() >= self._next_probe
        if due and not self._busy():
            self._next_probe = time.monotonic() + self._reprobe_every_s
            self._background = asyncio.create_task(self._recover(), name="knowledge-reprobe")
        return False

    def _busy(self) -> bool:
        return self._background is not None and not self._background.done()

    async def _recover(self) -> None:
        assert self._reprobe is not None
        self.unavailable = await self._reprobe()
        if self.unavailable is None:
            log.info("the embedder %s answers again: embedding what was stored without vectors", self.embedder.name)
            await self._backfill_quietly()

    def start_backfill(self) -> None:
        """Embed, in the background, the passages stored without vectors (nothing to do is cheap)."""
        if self.unavailable is None and not self._busy():
            self._background = asyncio.create_task(self._backfill_quietly(), name="knowledge-backfill")

    async def _backfill_quietly(self) -> None:
        try:
            if done := await self.backfill():
                log.info("embedded %d passages that were stored without vectors", done)
        except ProviderError as exc:
            self._lost(exc)
        except Exception:  # a background task: its failure is logged, the passages stay searchable by text
            log.exception("embedding the passages stored without vectors failed")

    def _lost(self, exc: ProviderError) -> None:
        """The embedder failed after it had worked: full text until a probe succeeds (a minute from now)."""
        self.unavailable = Unavailable(
            self.embedder.name,
            "lost",
            f"an embeddings request failed ({exc})",
            "Searching by full text meanwhile; the bot tries the embedder again every minute",
        )
        self._next_probe = time.monotonic() + self._reprobe_every_s
        log.warning("knowledge search falls back to full text: %s", self.unavailable)

    async def close(self, *, grace_s: float = 5.0) -> None:
        """Let the background probe or backfill finish, for `grace_s` at most, then stop it: its work is safe to
        interrupt (what it embedded is kept; the rest waits for the next start). Waiting first, because a query
        cancelled mid-flight can leave its connection, and its locks, behind for a while."""
        if self._background is None or self._background.done():
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self._background), timeout=grace_s)
        if not self._background.done():
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._background

    async def settle(self) -> None:
        """Wait for the background probe or backfill, if one runs (tests, and a clean shutdown)."""
        while self._busy():
            assert self._background is not None
            await asyncio.shield(self._background)

    def _vector_ready(self, row: m.KnowledgeCollection) -> bool:
        """Whether the collection can be searched by vector now."""
        return (
            self.unavailable is None
            and row.embedder == self.embedder.name
            and row.dim is not None
            and row.dim == self.embedder.dim
        )

    def _mismatch(self, row: m.KnowledgeCollection) -> str | None:
        """The collection's vectors are another model's (or another size): not comparable with this one's."""
        if row.dim is None or (row.embedder == self.embedder.name and row.dim == (self.embedder.dim or row.dim)):
            return None
        size = f"{self.embedder.dim} dimensions" if self.embedder.dim else "size not known yet"
        return (
            f"collection {row.name!r} was embedded with {row.embedder} ({row.dim} dimensions), but the configured "
            f"embedder is {self.embedder.name} ({size}). Re-embed it with "
            f"`python -m bot kb reembed --collection {row.name}`, or configure the embedder it was built with."
        )

    def _problem(self, row: m.KnowledgeCollection) -> str | None:
        if mismatch := self._mismatch(row):
            return mismatch
        if self.unavailable is not None:
            return f"collection {row.name!r} is searched by full text only: {self.unavailable}"
        if row.dim is None:
            return f"collection {row.name!r} has no vectors yet (being embedded): searched by full text meanwhile"
        return None

    async def ensure_collection(self, collection: str) -> None:
        works = self._embedder_works()
        async with self.sessions() as s, s.begin():
            await self._ensure(s, collection, claim=False)
            if works:
                await self._vectors_ready(s, collection)

    async def _ensure(self, s: AsyncSession, collection: str, *, claim: bool) -> None:
        """The collection exists (made if not) and is the configured embedder's; `claim`: a collection never embedded
        records this embedder's width (`_vectors_ready` does it, with the index)."""
        await s.execute(
            insert(m.KnowledgeCollection)
            .values(name=collection, embedder=self.embedder.name, dim=None)
            .on_conflict_do_nothing()
        )
        row = await s.get(m.KnowledgeCollection, collection)
        assert row is not None
        if problem := self._mismatch(row):
            raise EmbedderMismatch(problem)
        if row.dim is None and row.embedder != self.embedder.name:
            row.embedder = self.embedder.name  # never embedded: whichever embedder works may take it
        if claim:
            await self._claim(s, collection)

    async def _vectors_ready(self, s: AsyncSession, collection: str) -> None:
        await self._hnsw_index(s)
        await self._claim(s, collection)

    async def _hnsw_index(self, s: AsyncSession) -> None:
        # One partial HNSW index per dimension (the migration made 384 and 1536). Looked up first: CREATE INDEX IF
        # NOT EXISTS needs the table's owner even when the index is there, and the runtime role owns nothing.
        dim = int(self.embedder.dim)
        if await s.scalar(text(f"SELECT to_regclass('ix_kb_chunks_hnsw_{dim}') IS NOT NULL")):
            return
        await s.execute(
            text(
                f"CREATE INDEX IF NOT EXISTS ix_kb_chunks_hnsw_{dim} ON kb_chunks "
                f"USING hnsw ((embedding::vector({dim})) vector_cosine_ops) WHERE dim = {dim}"
            )
        )

    async def _claim(self, s: AsyncSession, collection: str) -> None:
        await s.execute(
            text("UPDATE kb_collections SET dim = :dim, embedder = :embedder WHERE name = :name AND dim IS NULL"),
            {"dim": int(self.embedder.dim), "name": collection, "embedder": self.embedder.name},
        )

    async def ingest(
        self,
        paths: Sequence[Path],
        *,
        collection: str,
        prune: bool = False,
        root: Path | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        require_vectors: bool = False,
    ) -> IngestReport:
        """Unchanged documents (same content hash) are skipped, changed ones replaced; with `prune`, documents
        of the collection that are no longer among `paths` are removed.

        All or nothing, in one transaction: a file that cannot be read (`IngestFailed`, naming it), or no document
        among `paths` at all, leaves the collection as it was (or not made). An embedder that fails stores the rest
        without vectors, embedded later (`backfill`); with `require_vectors` it fails the ingestion instead, as it
        does when no embedder works from the start: an operator's run, which they can start again."""
        files = find_documents(list(paths))
        if not files:
            raise IngestFailed(None, f"no documents to read (reads {', '.join(sorted(SUFFIXES))})")
        works = self._embedder_works()
        if require_vectors and not works:
            raise IngestFailed(None, f"no vectors can be made: {self.unavailable}")
        if works:
            # Apart, and first: CREATE INDEX locks the passages' table against writes until its transaction ends,
            # and the ingestion's may last minutes (a running bot's backfill writes there).
            async with self.sessions() as s, s.begin():
                await self._hnsw_index(s)
        added = replaced = unchanged = chunks = 0
        seen: set[str] = set()
        async with self.sessions() as s, s.begin():
            # The one transaction that waits on us for long (reading files, the embedder): exempt from the bound
            # the engine puts on a transaction left idle (`agents.db.engine.IDLE_IN_TRANSACTION_S`).
            await s.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
            await self._ensure(s, collection, claim=works)
            for index, path in enumerate(files):
                source = str(path.relative_to(root)) if root else str(path)
                seen.add(source)
                try:
                    document = await read_file(path, source=source)
                    outcome, count = await self._ingest_one(s, document, collection, require_vectors=require_vectors)
                except Unreadable as exc:
                    raise IngestFailed(path, str(exc)) from exc
                except OSError as exc:
                    raise IngestFailed(path, exc.strerror or str(exc)) from exc
                except ProviderError as exc:
                    raise IngestFailed(path, f"the embedder failed ({exc})") from exc
                added += outcome == "added"
                replaced += outcome == "replaced"
                unchanged += outcome == "unchanged"
                chunks += count
                if progress:
                    progress(index + 1, len(files), source)
            pruned = await self._prune(s, collection, seen) if prune else 0
        return IngestReport(added, replaced, unchanged, pruned, chunks)

    async def _ingest_one(
        self, s: AsyncSession, document: Document, collection: str, *, require_vectors: bool
    ) -> tuple[str, int]:
        existing = await s.scalar(
            select(m.KnowledgeDocument).where(
                m.KnowledgeDocument.collection == collection, m.KnowledgeDocument.source == document.source
            )
        )
        # The flag too: a document stored before it was read (migration 0022) is flagged at its next ingestion.
        if existing is not None and (existing.content_hash, existing.superseded) == (
            document.content_hash,
            document.superseded,
        ):
            return "unchanged", 0
        pieces = chunk_document(document)
        vectors: list[list[float] | None] = [None] * len(pieces)
        if pieces and self._embedder_works():
            try:
                vectors = list(await self.embedder.embed([c.embedding_text for c in pieces]))
            except ProviderError as exc:
                if require_vectors:
                    raise
                self._lost(exc)  # stored without vectors, embedded once the embedder answers again
        if existing is not None:
            await s.execute(delete(m.KnowledgeDocument).where(m.KnowledgeDocument.id == existing.id))
        doc = m.KnowledgeDocument(
            collection=collection,
            source=document.source,
            title=document.title,
            content_hash=document.content_hash,
            superseded=document.superseded,
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
                        "dim": self.embedder.dim if vector is not None else None,
                        "embedding": vector,
                        "identifiers": sorted(in_document(f"{c.title} {c.heading or ''} {c.text}")),
                    }
                    for c, vector in zip(pieces, vectors, strict=True)
                ],
            )
        return ("replaced" if existing is not None else "added"), len(pieces)

    async def backfill(self, *, progress: Callable[[int, int], None] | None = None, batch: int = 64) -> int:
        """Embed the passages stored without vectors, in collections of the configured embedder (and in those
        never embedded, which it takes); returns how many. A collection another model embedded is left alone
        (see `reembed`). One at a time: concurrent calls wait, then find less to do."""
        if self.unavailable is not None:
            return 0
        async with self._backfilling:
            async with self.sessions() as s, s.begin():
                await s.execute(
                    update(m.KnowledgeCollection)
                    .where(m.KnowledgeCollection.dim.is_(None))
                    .values(embedder=self.embedder.name)
                )
                collections = (
                    await s.scalars(
                        select(m.KnowledgeCollection.name).where(
                            m.KnowledgeCollection.embedder == self.embedder.name,
                            m.KnowledgeCollection.dim.is_(None) | (m.KnowledgeCollection.dim == self.embedder.dim),
                        )
                    )
                ).all()
                total = await s.scalar(
                    select(func.count()).where(
                        m.KnowledgeChunk.collection.in_(collections), m.KnowledgeChunk.dim.is_(None)
                    )
                )
            done = 0
            for collection in collections:
                async with self.sessions() as s, s.begin():
                    await self._vectors_ready(s, collection)
                while rows := await self._unembedded(collection, batch):
                    vectors = await self.embedder.embed([chunk.embedding_text for _, chunk in rows])
                    async with self.sessions() as s, s.begin():
                        for (chunk_id, _), vector in zip(rows, vectors, strict=True):
                            await s.execute(
                                text("UPDATE kb_chunks SET embedding = :v, dim = :dim WHERE id = :id AND dim IS NULL"),
                                {"v": str(vector), "dim": self.embedder.dim, "id": chunk_id},
                            )
                    done += len(rows)
                    if progress:
                        progress(done, int(total or 0))
            return done

    async def _unembedded(self, collection: str, limit: int) -> list[tuple[int, Chunk]]:
        async with self.sessions() as s:
            rows = await s.execute(
                select(m.KnowledgeChunk.id, m.KnowledgeChunk.title, m.KnowledgeChunk.heading, m.KnowledgeChunk.text)
                .where(m.KnowledgeChunk.collection == collection, m.KnowledgeChunk.dim.is_(None))
                .order_by(m.KnowledgeChunk.id)
                .limit(limit)
            )
            return [(chunk_id, Chunk(0, title, heading, body)) for chunk_id, title, heading, body in rows]

    async def reembed(self, collection: str, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Give the collection to the configured embedder: its vectors are dropped and made again from the
        stored passages (no need for the original files)."""
        if self.unavailable is not None:
            raise EmbedderMismatch(f"cannot re-embed: {self.unavailable}")
        async with self.sessions() as s, s.begin():
            found = await s.execute(
                text("UPDATE kb_collections SET embedder = :e, dim = NULL WHERE name = :n RETURNING name"),
                {"e": self.embedder.name, "n": collection},
            )
            if found.first() is None:
                raise EmbedderMismatch(f"there is no collection {collection!r}")
            await s.execute(
                text("UPDATE kb_chunks SET embedding = NULL, dim = NULL WHERE collection = :n"), {"n": collection}
            )
        return await self.backfill(progress=progress)

    async def _prune(self, s: AsyncSession, collection: str, keep: set[str]) -> int:
        result = await s.execute(
            delete(m.KnowledgeDocument)
            .where(m.KnowledgeDocument.collection == collection, m.KnowledgeDocument.source.not_in(keep))
            .returning(m.KnowledgeDocument.id)
        )
        return len(result.all())

    async def search(
        self, query: str, *, collections: Sequence[str] = (), k: int = 5, mode: Mode = "hybrid"
    ) -> list[Hit]:
        """Collections that cannot be searched by vector (see `status`), and passages stored without vectors, are
        searched by full text alone; no `collections` means all of them."""
        works = self._embedder_works()
        async with self.sessions() as s:
            rows = (
                await s.scalars(
                    select(m.KnowledgeCollection).where(m.KnowledgeCollection.name.in_(collections))
                    if collections
                    else select(m.KnowledgeCollection)
                )
            ).all()
        names = [row.name for row in rows]
        by_vector = [row.name for row in rows if works and self._vector_ready(row)]
        vector = await self.query_vector(query) if mode != "text" and by_vector else None
        if vector is None:
            by_vector = []
            mode = "text" if mode == "hybrid" else mode
        if not names:
            return []
        codes = in_question(query)
        # The vector and the full-text queries on two connections at once: a search takes as long as the slower.
        vector_ranked, (text_ranked, exact) = await asyncio.gather(
            self._vector(vector if mode != "text" else None, by_vector),
            self._lexical(query, codes, names if mode != "vector" else []),
        )
        similarity = {row[0]: float(row[6]) for row in vector_ranked}
        match = {row[0]: float(row[8]) for row in text_ranked}
        vectorless = {row[0] for row in text_ranked if row[7] is None}
        found = {row[0]: row for row in [*exact, *vector_ranked, *text_ranked]}
        scores: dict[int, float] = {}
        if mode == "vector":
            scores = dict(similarity)
        elif mode == "text":
            # By place, not ts_rank_cd: a passage with all the words ranks above any with some of them.
            scores = {row[0]: 1.0 / (rank + 1) for rank, row in enumerate(text_ranked)}
        else:
            for weight, ranking in ((1.0, vector_ranked), (self.text_weight, text_ranked)):
                for rank, row in enumerate(ranking):
                    share = float(row[8]) ** MATCH_POWER if row[8] is not None else 1.0
                    scores[row[0]] = scores.get(row[0], 0.0) + weight * share / (RRF_K + rank + 1)
        stale = {i for i, row in found.items() if row[9]}
        scores = {i: score * SUPERSEDED_WEIGHT if i in stale else score for i, score in scores.items()}
        # Passages naming the question's identifiers come first: most of them, then named in the title or
        # heading (the passage about that product rather than one that lists it), then by score.
        named = {row[0]: _named(codes, row) for row in exact}
        best = sorted({*scores, *named}, key=lambda i: (named.get(i, (0, 0)), scores.get(i, 0.0)), reverse=True)
        # The nearest current passage (a superseded page stays below the current one), if it holds some of the
        # question's words: one that holds none rests on the embedding alone, which its fused score reflects.
        nearest = next((row[0] for row in vector_ranked if not row[9]), None)
        if mode == "hybrid" and nearest is not None and nearest in match and self.nearest_at_worst is not None:
            best = _nearest_kept(best, nearest, at_worst=max(self.nearest_at_worst, len(named) + 1))
        best = best[:k]
        return [
            Hit(
                source=found[i][1],
                title=found[i][2],
                heading=found[i][3],
                text=found[i][4],
                score=scores.get(i, 0.0),
                similarity=similarity.get(i),
                collection=found[i][5],
                vector_searched=found[i][5] in by_vector and i not in vectorless,
                text_match=match.get(i),
                superseded=i in stale,
            )
            for i in best
        ]

    async def query_vector(self, query: str) -> list[float] | None:
        """The query's vector; None (full text only, until a probe succeeds) when the embedder fails now."""
        # Remembered: a customer's message is searched before the agent's first call, and the agent's own search
        # often repeats it; the router embeds the same message just before (`bot.runtime.calibrated_router`);
        # the local embedder takes tens of milliseconds a query.
        if (vector := self._query_vectors.get(query)) is not None:
            self._query_vectors.move_to_end(query)
            return vector
        try:
            [vector] = await self.embedder.embed([query])
        except ProviderError as exc:
            self._lost(exc)
            return None
        self._query_vectors[query] = vector
        while len(self._query_vectors) > self.remembered_queries:
            self._query_vectors.popitem(last=False)
        return vector

    async def _vector(self, vector: list[float] | None, collections: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        if vector is None or not collections:
            return []
        async with self.sessions() as s:
            if self._iterative is None:
                version = await s.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
                self._iterative = tuple(int(n) for n in str(version).split(".")[:2]) >= (0, 8)
            # The HNSW index is shared by every collection of a dimension, and filtered afterwards: beside a large
            # collection, the nearest ef_search entries may hold none of a small one's. pgvector's iterative scan
            # (0.8) keeps walking the index until the filter has let CANDIDATES through (or SCAN_TUPLES were
            # seen); in relaxed order, so the candidates are sorted again below. A cached generic plan would not
            # see the collection's size: plan per query. One round trip for the settings.
            iterative = (
                ", set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                f"set_config('hnsw.max_scan_tuples', '{SCAN_TUPLES}', true)"
            )
            await s.execute(
                text(
                    "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), "
                    f"set_config('hnsw.ef_search', '{EF_SEARCH}', true)" + (iterative if self._iterative else "")
                )
            )
            return await self._nearest(s, vector, collections)

    async def _nearest(self, s: AsyncSession, vector: list[float], collections: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        dim = int(self.embedder.dim)
        distance = f"(c.embedding::vector({dim}) <=> CAST(:q AS vector({dim})))"
        result = await s.execute(
            text(
                "WITH nearest AS MATERIALIZED ("
                f"SELECT c.id, d.source, c.title, c.heading, c.text, c.collection, 1 - {distance} AS similarity, "
                "c.dim, NULL AS matched, d.superseded "
                "FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id "
                f"WHERE c.dim = {dim} AND c.collection = ANY(:collections) "
                f"ORDER BY {distance} LIMIT {CANDIDATES}) "
                "SELECT * FROM nearest ORDER BY similarity DESC"
            ),
            {"q": str(vector), "collections": collections},
        )
        return [tuple(r) for r in result]

    async def _lexical(self, query: str, codes: set[str], collections: list[str]) -> tuple[list[tuple], list[tuple]]:  # type: ignore[type-arg]
        """The full-text ranking, and the passages naming the question's identifiers (one connection)."""
        if not collections:
            return [], []
        async with self.sessions() as s:
            ranked = await self._text(s, query, collections)
            return ranked, await self._identified(s, codes, collections) if codes else []

    async def _text(self, s: AsyncSession, query: str, collections: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        """Passages with all the question's words first; while fewer than ENOUGH_TEXT are found, those with at
        least half of them, then with any of them (a customer's sentence rarely has every word of the passage
        that answers it). Ranking every passage with any word is what made full text slow in a large
        collection; the stricter queries match few passages, so the common case ranks few."""
        # Planned for each query's own words, never by a cached generic plan: how many passages a tsquery matches
        # decides between scanning the table and the index. In the same round trip as the words.
        words = await s.scalar(
            text(
                "SELECT plainto_tsquery('english', :query)::text "
                "FROM set_config('plan_cache_mode', 'force_custom_plan', true)"
            ),
            {"query": query},
        )
        terms = str(words or "").split(" & ") if words else []
        # A step's matches are ranked by any of the words: ts_rank_cd's cost grows with the query's size, and the
        # "at least half" step ORs up to MAX_TERMS combinations (ten times slower to rank, for the same order
        # within the step, which is all that counts: the steps come one after the other).
        any_word = " | ".join(terms)
        ranked: list[tuple] = []  # type: ignore[type-arg]
        for tsqueries in relaxed(terms):
            if len(ranked) >= ENOUGH_TEXT:
                break
            ranked += await self._text_ranked(s, query, collections, tsqueries, any_word, [row[0] for row in ranked])
        return ranked

    async def _text_ranked(
        self, s: AsyncSession, query: str, collections: list[str], tsqueries: list[str], rank_by: str, skip: list[int]
    ) -> list[tuple]:  # type: ignore[type-arg]
        """The passages matching any of `tsqueries` (tsquery syntax, of the question's stemmed words), best first
        by `rank_by`."""
        # The step's tsqueries are bound in `matching` itself, not read from a CTE, so that the planner sees them:
        # a scan of the table that stops at RANKED_AT_MOST when most passages match (any of a few common words),
        # the GIN index when few do. Through a CTE it could not tell, and built the bitmap of every passage with
        # any of the words (20 ms at 100k passages) to keep 300 of them. `matched` (the share of the question's
        # words a passage holds) only for the passages kept.
        result = await s.execute(
            text(
                "WITH matching AS MATERIALIZED (SELECT c.id, c.tsv FROM kb_chunks c "
                "WHERE c.collection = ANY(:collections) AND c.tsv @@ ANY(CAST(:tsqs AS tsquery[])) "
                f"AND c.id <> ALL(:skip) LIMIT {RANKED_AT_MOST}), "
                "best AS (SELECT m.id, ts_rank_cd(m.tsv, CAST(:rank_by AS tsquery)) AS rank FROM matching m "
                f"ORDER BY rank DESC LIMIT {CANDIDATES}), "
                "q AS (SELECT tsvector_to_array(to_tsvector('english', :query)) AS words) "
                "SELECT c.id, d.source, c.title, c.heading, c.text, c.collection, best.rank, "
                "c.dim, (SELECT count(*) FILTER (WHERE c.tsv @@ plainto_tsquery('simple', w))::float "
                "  / greatest(count(*), 1) FROM unnest(q.words) AS w) AS matched, d.superseded "
                "FROM best JOIN kb_chunks c ON c.id = best.id JOIN kb_documents d ON d.id = c.document_id, q "
                "ORDER BY best.rank DESC, c.id"
            ),
            {"query": query, "tsqs": tsqueries, "rank_by": rank_by, "collections": collections, "skip": skip},
        )
        return [tuple(r) for r in result]

    async def _identified(self, s: AsyncSession, codes: set[str], collections: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        """Passages naming any of the identifiers (the GIN index on `identifiers`), most of them first."""
        result = await s.execute(
            text(
                "SELECT c.id, d.source, c.title, c.heading, c.text, c.collection, "
                "cardinality(ARRAY(SELECT unnest(c.identifiers) INTERSECT SELECT unnest(CAST(:codes AS text[])))) "
                "AS rank, c.dim, NULL AS matched, d.superseded "
                "FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id "
                "WHERE c.collection = ANY(:collections) AND c.identifiers && CAST(:codes AS text[]) "
                f"ORDER BY rank DESC, c.id LIMIT {CANDIDATES}"
            ),
            {"codes": sorted(codes), "collections": collections},
        )
        return [tuple(r) for r in result]

    async def status(self) -> KnowledgeStatus:
        """How each collection is searched, and why not by vector where it is not."""
        self._embedder_works()
        async with self.sessions() as s:
            rows = (await s.scalars(select(m.KnowledgeCollection).order_by(m.KnowledgeCollection.name))).all()
            unembedded = await s.scalar(select(func.count()).where(m.KnowledgeChunk.dim.is_(None)))
        collections = tuple(
            CollectionStatus(row.name, row.embedder, row.dim, self._vector_ready(row), self._problem(row))
            for row in rows
        )
        return KnowledgeStatus(
            self.embedder.name, self.embedder.dim or None, self.unavailable, collections, int(unembedded or 0)
        )

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


def _nearest_kept(ranked: list[int], nearest: int, at_worst: int) -> list[int]:
    """`ranked` with the passage nearest in meaning moved up to `at_worst` if it was lower."""
    place = ranked.index(nearest)
    if place < at_worst:
        return ranked
    return [*ranked[: at_worst - 1], nearest, *(i for i in ranked[at_worst - 1 :] if i != nearest)]


def _named(codes: set[str], row: tuple) -> tuple[int, int]:  # type: ignore[type-arg]
    """How many of the question's identifiers the passage names, and how many in its title or heading."""
    return int(row[6]), len(codes & in_document(f"{row[2]} {row[3] or ''}"))


def relaxed(words: Sequence[str]) -> list[list[str]]:
    """The steps of the full-text search, each a list of tsqueries a passage must match one of: all the words, at
    least half of them (one conjunction per combination, each its own index search: GIN evaluates one big OR of
    conjunctions against every passage holding any of the words, which took 50 ms at 100k passages), and any
    of them (`words` in tsquery syntax)."""
    steps = sorted({len(words), (len(words) + 1) // 2, 1} - {0}, reverse=True)
    return [
        [" | ".join(words)] if m == 1 else [" & ".join(c) for c in itertools.combinations(words, m)]
        for m in steps
        if math.comb(len(words), m) <= MAX_TERMS
    ]
