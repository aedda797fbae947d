"""The knowledge base in Postgres: idempotent ingestion, all or nothing, and hybrid search.

Search runs a vector query (cosine distance on the collection's HNSW index) and a full-text query (the
question's words, all of them first, then fewer) and fuses the two rankings by reciprocal rank fusion (a
full-text place weighted by the share of the question's words the passage holds), so that an
exact product code (which embeddings blur) and a paraphrase (which shares no words) are both found.

Full text is in each document's language: the one declared for its collection, else detected from its text, else
English; stemmed by that language's Postgres configuration from accent-folded text. A question is searched in every
language of the collections it is asked of (its words stemmed each way), so a customer finds a document whatever
its language, and with or without accents.

Each collection is embedded by one model, recorded with it: the one model configured for all (a provider's, or a
local one the operator chose), or, with the local models chosen per collection (EMBEDDINGS=local), the English one
for a collection whose documents are all English and the multilingual one for any other; the choice is made again
at each ingestion and by `reembed`. A search embeds the question once per model among the collections searched,
and fuses each model's ranking as a list of its own (cosines of two models are not comparable).

The embedder is optional. While it does not work (`Unavailable`), documents are stored without vectors and
every search is full text; a collection embedded by a model that is not configured is searched by full text
too. `status()` says which, and why; `backfill()` embeds what was stored without vectors once the
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.errors import AgentsError, ProviderError
from agents.knowledge.chunking import Chunk, chunk_document
from agents.knowledge.documents import SUFFIXES, Document, find_documents
from agents.knowledge.embedders import Embedder, LocalModel, OpenAIEmbedder, Unavailable
from agents.knowledge.identifiers import in_document, in_question
from agents.knowledge.readers import Unreadable, read_file
from agents.language import Language, detect, fold

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
DETECTED_FROM = 5_000
"""Characters of a document its language is detected from: more changes nothing but the time it takes."""
TSV = (
    "setweight(to_tsvector(CAST(:config AS regconfig), :folded_head), 'A') || "
    "setweight(to_tsvector(CAST(:config AS regconfig), :folded_text), 'B')"
)
"""A passage's full text: written at ingestion, not generated by Postgres, because the text is folded first (Python's
`fold`: the embedded Postgres has no `unaccent`), so that "bateria" and "batería" stem alike."""
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
    """The fused score (hybrid; in vector mode, of the models' rankings alone) or 1 / place in the full-text ranking
    (text). Hits come in score order but for passages naming the question's identifiers (first) and the one nearest
    in meaning (`NEAREST_AT_WORST`)."""
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
    min_similarity: float | None = None
    """The cut-off of the model that ranked it (`Embedder.min_similarity`), when the vector search saw it: below,
    the passage counts as unrelated to the question. Each model spreads its cosines differently."""

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
        english: Embedder | None = None,
        unavailable: Unavailable | None = None,
        reprobe: Callable[[], Awaitable[Unavailable | None]] | None = None,
        reprobe_every_s: float = REPROBE_S,
        text_weight: float = TEXT_WEIGHT,
        remembered_queries: int = REMEMBERED_QUERIES,
        nearest_at_worst: int | None = NEAREST_AT_WORST,
    ) -> None:
        self.sessions = sessions
        self.embedder = embedder
        """The model of every collection; with `english`, of those not all in English."""
        self.english = english
        """When set, the model of the collections whose documents are all English (the local models chosen per
        collection): a model for one language ranks its language better than a multilingual one of its size."""
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
        self._query_vectors: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        """The vectors of the latest queries by (model, query), least recently used first (bounded by
        `remembered_queries`)."""
        self._languages: dict[str, tuple[str, ...]] = {}
        """Each collection's document languages, as last read (`languages`)."""
        self._iterative: bool | None = None
        """Whether pgvector (0.8 or later) scans HNSW iteratively; asked once, at the first vector search."""

    # --- which model embeds a collection ---

    @property
    def models(self) -> tuple[Embedder, ...]:
        """The configured models, the English one first."""
        return (self.english, self.embedder) if self.english is not None else (self.embedder,)

    @property
    def described(self) -> str:
        """The configured models, as status shows them."""
        if self.english is None:
            return self.embedder.name
        return f"{self.english.name} for English collections, {self.embedder.name} for the others"

    def chosen(self, languages: Iterable[str]) -> Embedder:
        """The model for a collection of documents in `languages` (none yet: the English one, which a first
        non-English document replaces at its ingestion)."""
        if self.english is not None and all(code == Language.EN.value for code in languages):
            return self.english
        return self.embedder

    def _model(self, name: str) -> Embedder | None:
        return next((model for model in self.models if model.name == name), None)

    def languages(self, collections: Sequence[str]) -> list[Language]:
        """The languages of the documents in `collections` (all when empty), as last read by a search, an
        ingestion or `status`."""
        names = collections or list(self._languages)
        codes = {code for name in names for code in self._languages.get(name, ())}
        return sorted({Language.parse(code) or Language.EN for code in codes})

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
            log.info("the embedder %s answers again: embedding what was stored without vectors", self.described)
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

    def _lost(self, exc: ProviderError, model: Embedder | None = None) -> None:
        """The embedder failed after it had worked: full text until a probe succeeds (a minute from now)."""
        self.unavailable = Unavailable(
            (model or self.embedder).name,
            "lost",
            f"an embeddings request failed ({exc})",
            "Searching by full text meanwhile; the bot tries the embedder again every minute",
        )
        self._next_probe = time.monotonic() + self._reprobe_every_s
        log.warning("knowledge search falls back to full text: %s", self.unavailable)

    async def close(self, *, grace_s: float = 5.0) -> None:
        """Let the background probe or backfill finish, for `grace_s` at most, then stop it: its work is safe to
        interrupt (what it embedded is kept; the rest waits for the next start). Waiting first, because a query
        cancelled mid-flight can leave its connection, and its locks, behind for a while. A provider's client and
        the local models' threads close last."""
        try:
            await self._stop_background(grace_s)
        finally:
            for model in self.models:
                if isinstance(model, LocalModel):
                    model.close()
            if isinstance(self.embedder, OpenAIEmbedder):
                await self.embedder.close()

    async def _stop_background(self, grace_s: float) -> None:
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
        model = self._model(row.embedder)
        return self.unavailable is None and model is not None and row.dim is not None and row.dim == model.dim

    def _mismatch(self, row: m.KnowledgeCollection) -> str | None:
        """The collection's vectors are of a model not configured (or another size): not comparable with theirs."""
        model = self._model(row.embedder)
        if row.dim is None or (model is not None and row.dim == (model.dim or row.dim)):
            return None
        sizes = ", ".join(f"{m.dim} dimensions" if m.dim else "size not known yet" for m in self.models)
        return (
            f"collection {row.name!r} was embedded with {row.embedder} ({row.dim} dimensions), but the configured "
            f"embedder is {self.described} ({sizes}). Re-embed it with "
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
            row = await self._ensure(s, collection, claim=False)
            if works:
                await self._vectors_ready(s, collection, self._model(row.embedder) or self.embedder)

    async def _ensure(
        self,
        s: AsyncSession,
        collection: str,
        *,
        claim: bool,
        language: Language | None = None,
        model: Embedder | None = None,
    ) -> m.KnowledgeCollection:
        """The collection exists (made if not) and is embedded by `model` (by default the one its languages choose):
        one never embedded takes it; one embedded by another configured model has its vectors dropped, to be made
        again (`_embed_stored`). `claim`: a collection never embedded records the model's width (`_vectors_ready`
        does it, with the index); `language`: declared for it."""
        await s.execute(
            insert(m.KnowledgeCollection)
            .values(name=collection, embedder=(model or self.chosen(())).name, dim=None)
            .on_conflict_do_nothing()
        )
        row = await s.get(m.KnowledgeCollection, collection)
        assert row is not None
        if problem := self._mismatch(row):
            raise EmbedderMismatch(problem)
        if model is None:  # the record holds until an ingestion or `reembed` chooses again
            model = (self._model(row.embedder) if row.dim is not None else None) or self.chosen(row.languages)
        if row.embedder != model.name:
            if row.dim is not None:
                await s.execute(
                    text("UPDATE kb_chunks SET embedding = NULL, dim = NULL WHERE collection = :n"), {"n": collection}
                )
                row.dim = None
            row.embedder = model.name
        if language is not None:
            row.language = language.value
        if claim:
            await s.flush()
            await self._claim(s, collection, model)
        return row

    async def _vectors_ready(self, s: AsyncSession, collection: str, model: Embedder) -> None:
        await self._hnsw_index(s, model.dim)
        await self._claim(s, collection, model)

    async def _hnsw_index(self, s: AsyncSession, dim: int) -> None:
        # One partial HNSW index per dimension (the migration made 384 and 1536), shared by the models of that width
        # (searches filter by collection, each of one model). Looked up first: CREATE INDEX IF NOT EXISTS needs the
        # table's owner even when the index is there, and the runtime role owns nothing.
        dim = int(dim)
        if await s.scalar(text(f"SELECT to_regclass('ix_kb_chunks_hnsw_{dim}') IS NOT NULL")):
            return
        await s.execute(
            text(
                f"CREATE INDEX IF NOT EXISTS ix_kb_chunks_hnsw_{dim} ON kb_chunks "
                f"USING hnsw ((embedding::vector({dim})) vector_cosine_ops) WHERE dim = {dim}"
            )
        )

    async def _claim(self, s: AsyncSession, collection: str, model: Embedder) -> None:
        await s.execute(
            text("UPDATE kb_collections SET dim = :dim, embedder = :embedder WHERE name = :name AND dim IS NULL"),
            {"dim": int(model.dim), "name": collection, "embedder": model.name},
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
        language: Language | None = None,
    ) -> IngestReport:
        """Unchanged documents (same content hash) are skipped, changed ones replaced; with `prune`, documents
        of the collection that are no longer among `paths` are removed.

        All or nothing, in one transaction: a file that cannot be read (`IngestFailed`, naming it), or no document
        among `paths` at all, leaves the collection as it was (or not made). An embedder that fails stores the rest
        without vectors, embedded later (`backfill`); with `require_vectors` it fails the ingestion instead, as it
        does when no embedder works from the start: an operator's run, which they can start again.

        `language` declares the collection's (kept for its later ingestions); without one ever declared, each
        document's is detected from its text (English when unsure). A document stored in another language than it
        now gets is replaced, as a changed one is. The collection's model is chosen again from the languages it
        holds afterwards (`chosen`): when that changes it, the passages kept are embedded again too."""
        files = find_documents(list(paths))
        if not files:
            raise IngestFailed(None, f"no documents to read (reads {', '.join(sorted(SUFFIXES))})")
        works = self._embedder_works()
        if require_vectors and not works:
            raise IngestFailed(None, f"no vectors can be made: {self.unavailable}")
        # Every file read (and its language told) first: the languages choose the model that embeds them.
        async with self.sessions() as s:
            row = await s.get(m.KnowledgeCollection, collection)
            declared = language or (Language.parse(row.language) if row is not None else None)
            listed = await s.execute(
                select(m.KnowledgeDocument.source, m.KnowledgeDocument.language).where(
                    m.KnowledgeDocument.collection == collection
                )
            )
            stored: dict[str, str | None] = {source: code for source, code in listed}
        read: list[tuple[Path, Document, list[Chunk], Language]] = []
        for path in files:
            source = str(path.relative_to(root)) if root else str(path)
            try:
                document = await read_file(path, source=source)
            except Unreadable as exc:
                raise IngestFailed(path, str(exc)) from exc
            except OSError as exc:
                raise IngestFailed(path, exc.strerror or str(exc)) from exc
            pieces = chunk_document(document)
            read.append((path, document, pieces, declared or _detected(document.title, pieces)))
        seen = {document.source for _, document, _, _ in read}
        kept = set() if prune else {code or Language.EN.value for src, code in stored.items() if src not in seen}
        model = self.chosen({lang.value for *_, lang in read} | kept)
        if works:
            # Apart, and first: CREATE INDEX locks the passages' table against writes until its transaction ends,
            # and the ingestion's may last minutes (a running bot's backfill writes there).
            async with self.sessions() as s, s.begin():
                await self._hnsw_index(s, model.dim)
        added = replaced = unchanged = chunks = 0
        async with self.sessions() as s, s.begin():
            # The one transaction that waits on us for long (reading files, the embedder): exempt from the bound
            # the engine puts on a transaction left idle (`agents.db.engine.IDLE_IN_TRANSACTION_S`).
            await s.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
            row = await self._ensure(s, collection, claim=works, language=language, model=model)
            languages = set(row.languages)
            for index, (path, document, pieces, lang) in enumerate(read):
                try:
                    outcome, count = await self._ingest_one(
                        s, document, pieces, lang, collection, model=model, require_vectors=require_vectors
                    )
                except ProviderError as exc:
                    raise IngestFailed(path, f"the embedder failed ({exc})") from exc
                added += outcome == "added"
                replaced += outcome == "replaced"
                unchanged += outcome == "unchanged"
                chunks += count
                languages.add(lang.value)
                if progress:
                    progress(index + 1, len(read), document.source)
            pruned = await self._prune(s, collection, seen) if prune else 0
            if prune:
                languages = {lang.value for *_, lang in read}
            if languages != set(row.languages):
                row.languages = sorted(languages)
            self._languages[collection] = tuple(row.languages)
            if works:
                try:
                    await self._embed_stored(s, collection, model)
                except ProviderError as exc:
                    if require_vectors:
                        raise IngestFailed(None, f"the embedder failed ({exc})") from exc
                    self._lost(exc, model)
        return IngestReport(added, replaced, unchanged, pruned, chunks)

    async def _ingest_one(
        self,
        s: AsyncSession,
        document: Document,
        pieces: list[Chunk],
        language: Language,
        collection: str,
        *,
        model: Embedder,
        require_vectors: bool,
    ) -> tuple[str, int]:
        """Whether the document was added, replaced or unchanged; its passages."""
        existing = await s.scalar(
            select(m.KnowledgeDocument).where(
                m.KnowledgeDocument.collection == collection, m.KnowledgeDocument.source == document.source
            )
        )
        # The flag too: a document stored before it was read (migration 0022) is flagged at its next ingestion.
        if existing is not None and (existing.content_hash, existing.superseded, existing.language) == (
            document.content_hash,
            document.superseded,
            language.value,
        ):
            return "unchanged", 0
        vectors: list[list[float] | None] = [None] * len(pieces)
        if pieces and self._embedder_works():
            try:
                vectors = list(await model.embed([c.embedding_text for c in pieces]))
            except ProviderError as exc:
                if require_vectors:
                    raise
                self._lost(exc, model)  # stored without vectors, embedded once the embedder answers again
        if existing is not None:
            await s.execute(delete(m.KnowledgeDocument).where(m.KnowledgeDocument.id == existing.id))
        doc = m.KnowledgeDocument(
            collection=collection,
            source=document.source,
            title=document.title,
            content_hash=document.content_hash,
            superseded=document.superseded,
            language=language.value,
        )
        s.add(doc)
        await s.flush()
        if pieces:
            await s.execute(
                insert(m.KnowledgeChunk.__table__).values(tsv=text(TSV)),  # type: ignore[arg-type]
                [
                    {
                        "document_id": doc.id,
                        "collection": collection,
                        "ordinal": c.ordinal,
                        "title": c.title,
                        "heading": c.heading,
                        "text": c.text,
                        "dim": model.dim if vector is not None else None,
                        "embedding": vector,
                        "identifiers": sorted(in_document(f"{c.title} {c.heading or ''} {c.text}")),
                        "config": language.pg_config,
                        "folded_head": fold(f"{c.title} {c.heading or ''}"),
                        "folded_text": fold(c.text),
                    }
                    for c, vector in zip(pieces, vectors, strict=True)
                ],
            )
        return ("replaced" if existing is not None else "added"), len(pieces)

    async def _embed_stored(self, s: AsyncSession, collection: str, model: Embedder, batch: int = 64) -> None:
        """Embed, within the ingestion, the passages it kept without vectors: those of documents it left unchanged
        when it gave the collection to another model."""
        while rows := await self._unembedded(collection, batch, s):
            vectors = await model.embed([chunk.embedding_text for _, chunk in rows])
            await self._store_vectors(s, rows, vectors, model)

    async def _store_vectors(
        self, s: AsyncSession, rows: list[tuple[int, Chunk]], vectors: list[list[float]], model: Embedder
    ) -> None:
        for (chunk_id, _), vector in zip(rows, vectors, strict=True):
            await s.execute(
                text("UPDATE kb_chunks SET embedding = :v, dim = :dim WHERE id = :id AND dim IS NULL"),
                {"v": str(vector), "dim": model.dim, "id": chunk_id},
            )

    async def backfill(self, *, progress: Callable[[int, int], None] | None = None, batch: int = 64) -> int:
        """Embed the passages stored without vectors, each collection by its model (a collection never embedded
        takes the model its languages choose); returns how many. A collection embedded by a model not configured
        is left alone (see `reembed`). One at a time: concurrent calls wait, then find less to do."""
        if self.unavailable is not None:
            return 0
        async with self._backfilling:
            async with self.sessions() as s, s.begin():
                for row in await s.scalars(select(m.KnowledgeCollection).where(m.KnowledgeCollection.dim.is_(None))):
                    row.embedder = self.chosen(row.languages).name
                models = {
                    row.name: model
                    for row in await s.scalars(select(m.KnowledgeCollection))
                    if (model := self._model(row.embedder)) is not None and row.dim in (None, model.dim)
                }
                total = await s.scalar(
                    select(func.count()).where(
                        m.KnowledgeChunk.collection.in_(list(models)), m.KnowledgeChunk.dim.is_(None)
                    )
                )
            done = 0
            for collection, model in models.items():
                async with self.sessions() as s, s.begin():
                    await self._vectors_ready(s, collection, model)
                while rows := await self._unembedded(collection, batch):
                    vectors = await model.embed([chunk.embedding_text for _, chunk in rows])
                    async with self.sessions() as s, s.begin():
                        await self._store_vectors(s, rows, vectors, model)
                    done += len(rows)
                    if progress:
                        progress(done, int(total or 0))
            return done

    async def _unembedded(self, collection: str, limit: int, s: AsyncSession | None = None) -> list[tuple[int, Chunk]]:
        query = (
            select(m.KnowledgeChunk.id, m.KnowledgeChunk.title, m.KnowledgeChunk.heading, m.KnowledgeChunk.text)
            .where(m.KnowledgeChunk.collection == collection, m.KnowledgeChunk.dim.is_(None))
            .order_by(m.KnowledgeChunk.id)
            .limit(limit)
        )
        if s is not None:
            rows = await s.execute(query)
        else:
            async with self.sessions() as own:
                rows = await own.execute(query)
        return [(chunk_id, Chunk(0, title, heading, body)) for chunk_id, title, heading, body in rows]

    async def reembed(self, collection: str, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Give the collection to the model its languages choose among those configured: its vectors are dropped
        and made again from the stored passages (no need for the original files)."""
        if self.unavailable is not None:
            raise EmbedderMismatch(f"cannot re-embed: {self.unavailable}")
        async with self.sessions() as s, s.begin():
            row = await s.get(m.KnowledgeCollection, collection)
            if row is None:
                raise EmbedderMismatch(f"there is no collection {collection!r}")
            row.embedder, row.dim = self.chosen(row.languages).name, None
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
        searched by full text alone; no `collections` means all of them.

        The question is embedded once by each model among the collections searched (a model no collection needs is
        never loaded), and each model's ranking is a list of its own in the fusion, as the full-text one is; in
        `vector` mode too, by place, since cosines of two models are not comparable."""
        works = self._embedder_works()
        async with self.sessions() as s:
            rows = (
                await s.scalars(
                    select(m.KnowledgeCollection).where(m.KnowledgeCollection.name.in_(collections))
                    if collections
                    else select(m.KnowledgeCollection)
                )
            ).all()
        order = {name: place for place, name in enumerate(collections)}
        rows = sorted(rows, key=lambda row: (order.get(row.name, 0), row.name))
        self._languages |= {row.name: tuple(row.languages) for row in rows}
        names = [row.name for row in rows]
        groups: dict[str, tuple[Embedder, list[str]]] = {}
        for row in rows:
            if mode != "text" and works and self._vector_ready(row) and (model := self._model(row.embedder)):
                groups.setdefault(model.name, (model, []))[1].append(row.name)
        vectors = [
            (model, vector, of) for model, of in groups.values() if (vector := await self.query_vector(query, model))
        ]
        if not vectors:
            mode = "text" if mode == "hybrid" else mode
        if not names:
            return []
        codes = in_question(query)
        configs = text_configs(code for row in rows for code in row.languages) or [Language.EN.pg_config]
        # The vector queries and the full-text one on connections of their own at once: a search takes as long as
        # the slowest.
        *vector_rankings, (text_ranked, exact) = await asyncio.gather(
            *(self._vector(vector, of, model.dim) for model, vector, of in vectors),
            self._lexical(query, codes, names if mode != "vector" else [], configs),
        )
        by_vector = {name for _, _, of in vectors for name in of}
        cut_off = {
            row[0]: model.min_similarity
            for (model, _, _), ranking in zip(vectors, vector_rankings, strict=True)
            for row in ranking
        }
        similarity = {row[0]: float(row[6]) for ranking in vector_rankings for row in ranking}
        match = {row[0]: float(row[8]) for row in text_ranked}
        vectorless = {row[0] for row in text_ranked if row[7] is None}
        found = {row[0]: row for row in [*exact, *(row for r in vector_rankings for row in r), *text_ranked]}
        scores: dict[int, float] = {}
        if mode == "text":
            # By place, not ts_rank_cd: a passage with all the words ranks above any with some of them.
            scores = {row[0]: 1.0 / (rank + 1) for rank, row in enumerate(text_ranked)}
        else:
            lists = [(1.0, ranking) for ranking in vector_rankings]
            for weight, ranking in lists + ([(self.text_weight, text_ranked)] if mode == "hybrid" else []):
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
        # With several models, the nearest by the one whose nearest scores best in the fusion.
        tops = [next((row[0] for row in ranking if not row[9]), None) for ranking in vector_rankings]
        nearest = max((i for i in tops if i is not None), key=lambda i: scores.get(i, 0.0), default=None)
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
                min_similarity=cut_off.get(i),
            )
            for i in best
        ]

    async def query_vector(self, query: str, model: Embedder | None = None) -> list[float] | None:
        """The query's vector by `model` (by default the one for all collections); None (full text only, until a
        probe succeeds) when it fails now."""
        # Remembered: a customer's message is searched before the agent's first call, and the agent's own search
        # often repeats it; the local embedder takes milliseconds a query.
        model = model or self.embedder
        key = (model.name, query)
        if (vector := self._query_vectors.get(key)) is not None:
            self._query_vectors.move_to_end(key)
            return vector
        try:
            [vector] = await model.embed_query([query])
        except ProviderError as exc:
            self._lost(exc, model)
            return None
        self._query_vectors[key] = vector
        while len(self._query_vectors) > self.remembered_queries:
            self._query_vectors.popitem(last=False)
        return vector

    async def _vector(self, vector: list[float], collections: list[str], dim: int) -> list[tuple]:  # type: ignore[type-arg]
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
            return await self._nearest(s, vector, collections, int(dim))

    async def _nearest(self, s: AsyncSession, vector: list[float], collections: list[str], dim: int) -> list[tuple]:  # type: ignore[type-arg]
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

    async def _lexical(
        self, query: str, codes: set[str], collections: list[str], configs: list[str]
    ) -> tuple[list[tuple], list[tuple]]:  # type: ignore[type-arg]
        """The full-text ranking (in each of `configs`), and the passages naming the question's identifiers (one
        connection)."""
        if not collections:
            return [], []
        async with self.sessions() as s:
            ranked = await self._text(s, fold(query), collections, configs)
            return ranked, await self._identified(s, codes, collections) if codes else []

    async def _text(self, s: AsyncSession, query: str, collections: list[str], configs: list[str]) -> list[tuple]:  # type: ignore[type-arg]
        """Passages with all the question's words first; while fewer than ENOUGH_TEXT are found, those with at
        least half of them, then with any of them (a customer's sentence rarely has every word of the passage
        that answers it). Ranking every passage with any word is what made full text slow in a large
        collection; the stricter queries match few passages, so the common case ranks few. `query` is folded;
        each step holds its tsqueries in every configuration of `configs`."""
        # Planned for each query's own words, never by a cached generic plan: how many passages a tsquery matches
        # decides between scanning the table and the index. In the same round trip as the words.
        words = await s.scalars(
            text(
                "SELECT plainto_tsquery(CAST(cfg AS regconfig), :query)::text "
                "FROM unnest(CAST(:configs AS text[])) AS cfg, set_config('plan_cache_mode', 'force_custom_plan', true)"
            ),
            {"query": query, "configs": configs},
        )
        terms = [str(w).split(" & ") for w in words if w]
        # A step's matches are ranked by any of the words: ts_rank_cd's cost grows with the query's size, and the
        # "at least half" step ORs up to MAX_TERMS combinations (ten times slower to rank, for the same order
        # within the step, which is all that counts: the steps come one after the other).
        any_word = " | ".join(dict.fromkeys(t for words_of in terms for t in words_of))
        ranked: list[tuple] = []  # type: ignore[type-arg]
        for tsqueries in relaxed_in(terms):
            if len(ranked) >= ENOUGH_TEXT:
                break
            ranked += await self._text_ranked(
                s, query, collections, configs, tsqueries, any_word, [row[0] for row in ranked]
            )
        return ranked

    async def _text_ranked(
        self,
        s: AsyncSession,
        query: str,
        collections: list[str],
        configs: list[str],
        tsqueries: list[str],
        rank_by: str,
        skip: list[int],
    ) -> list[tuple]:  # type: ignore[type-arg]
        """The passages matching any of `tsqueries` (tsquery syntax, of the question's stemmed words), best first
        by `rank_by`. A passage's share of the question's words is taken in the configuration it shares most in."""
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
                "q AS (SELECT tsvector_to_array(to_tsvector(CAST(cfg AS regconfig), :query)) AS words "
                "  FROM unnest(CAST(:configs AS text[])) AS cfg) "
                "SELECT c.id, d.source, c.title, c.heading, c.text, c.collection, best.rank, "
                "c.dim, (SELECT max((SELECT count(*) FILTER (WHERE c.tsv @@ plainto_tsquery('simple', w))::float "
                "  / greatest(count(*), 1) FROM unnest(q.words) AS w)) FROM q) AS matched, d.superseded "
                "FROM best JOIN kb_chunks c ON c.id = best.id JOIN kb_documents d ON d.id = c.document_id "
                "ORDER BY best.rank DESC, c.id"
            ),
            {
                "query": query,
                "configs": configs,
                "tsqs": tsqueries,
                "rank_by": rank_by,
                "collections": collections,
                "skip": skip,
            },
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
        self._languages = {row.name: tuple(row.languages) for row in rows}
        collections = tuple(
            CollectionStatus(row.name, row.embedder, row.dim, self._vector_ready(row), self._problem(row))
            for row in rows
        )
        return KnowledgeStatus(
            self.described, self.embedder.dim or None, self.unavailable, collections, int(unembedded or 0)
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


def relaxed_in(terms: Sequence[Sequence[str]]) -> list[list[str]]:
    """`relaxed` for the question's words stemmed in several configurations (`terms`, one list each): the first
    step holds each configuration's first, and so on; a tsquery that several give is asked once."""
    steps = [relaxed(words) for words in terms if words]
    merged = [[q for step in at for q in step] for at in itertools.zip_longest(*steps, fillvalue=[])]
    return [list(dict.fromkeys(step)) for step in merged]


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


def _detected(title: str, pieces: Sequence[Chunk]) -> Language:
    """The document's language from its text, English when the detector is unsure (or there is too little text)."""
    sample = title + "\n" + "\n".join(c.text for c in pieces)
    return detect(sample[:DETECTED_FROM]) or Language.EN


def text_configs(languages: Iterable[str]) -> list[str]:
    """The text-search configurations of `languages` (documents stored before languages were recorded are
    English), in a stable order."""
    return sorted({(Language.parse(code) or Language.EN).pg_config for code in languages})
