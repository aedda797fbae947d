"""Benchmark of the knowledge base: retrieval quality and abstention on the sample documents, similarity
routing, search latency (at the sample's size and on a synthetic collection of 100,000 chunks), and
ingestion and embedding throughput of the local embedder (all-MiniLM-L6-v2 run with NumPy).

Everything is real: Postgres with pgvector (the embedded Postgres, or the server in BENCH_DATABASE_URL), a
fresh database built by the migrations, `KnowledgeBase` as the agents use it and the local embedder. Only the
synthetic collection is embedded by a stub that returns random unit vectors, since its text is random too.

Figures
    ingestion    the sample's `catalogue` and `support` folders ingested into fresh collections: documents and
                 chunks per second, the share (and rate) of embedding in it, a second (unchanged) ingest; the
                 model alone (`MiniLM.encode`) on chunk texts spread by length (sentences/s), and the process
                 RSS before and after loading the model and after ingestion
    quality      for each answerable question of bench/data/kb_eval.jsonl, searched in its collection: the
                 rank of the first right passage (its document, and its section heading when the question
                 names one) with vector-only, full-text-only and hybrid search: recall@1, recall@5, MRR@10,
                 overall and by kind (exact wording / paraphrase); as the product runs them (pooled
                 connections, whose cached generic plan may scan the HNSW index and filter the collection
                 afterwards) and again with custom plans only, with the vector candidates a search gets
    abstention   `relevant(hits, question, threshold)` over the hybrid hits the search tool takes (k=4): how
                 often it keeps nothing for an unanswerable question (searched in both collections; correct)
                 and for an answerable one (wrong), at several thresholds around the default
    routing      bench/data/routing.jsonl routed: ASKS_FOR_PERSON first (-> human), else `SimilarityRouter` over
                 the roster's descriptions, transferring only at a score >= the threshold (else triage keeps
                 it): accuracy, per label, confusion table, threshold sweep; then as the offline model routes
                 (the most similar passage's agent when it counts as found, else by description)
    latency      hybrid search at the sample's size with the query embedded (total, embedding, rest); then
                 on a synthetic collection (random unit vectors, text drawn from the sample's vocabulary with
                 Zipf-like frequencies) bulk-loaded with COPY: load and HNSW build time, insert rate with the
                 index live, EXPLAIN of the product's own SQL (captured from `KnowledgeBase.search`; custom
                 and generic plan) to show the HNSW index is used, a recall probe of the index, hybrid /
                 vector / text latency and the vector query with the index disabled; and whether the
                 sample's retrieval quality holds with that collection in the same table

The CPU-bound parts (the embedder above all) are slower when the machine is busy: the load average at the
start and end of the run is recorded with the figures.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
import numpy as np
from numpy.typing import NDArray
from pgvector.asyncpg import register_vector
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from agents.knowledge.chunking import chunk_document
from agents.knowledge.documents import find_documents, read_document
from agents.knowledge.embedders import Embedder
from agents.knowledge.local import MODEL, LocalEmbedder, MiniLM
from agents.knowledge.store import CANDIDATES, TEXT_WEIGHT, Hit, KnowledgeBase, Mode
from agents.knowledge.tool import relevant, search_knowledge_tool
from agents.offline import ASKS_FOR_PERSON, OfflineModel, SimilarityRouter
from agents.roster import KNOWLEDGE_OF, default_roster
from bench.setup import (
    RESULTS,
    admin,
    postgres_server,
    quiet,
    section,
    summary,
    table,
    throwaway_database,
    write_report,
)
from bench.setup import machine as base_machine
from bot.runtime import SAMPLE_KNOWLEDGE
from db.engine import make_engine, make_sessions
from db.url import async_url

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = SAMPLE_KNOWLEDGE
DATA = Path(__file__).resolve().parent / "data"
COLLECTIONS = ("catalogue", "support")
SYNTHETIC = "bench-synthetic"
DIM = 384
HNSW_INDEX = f"ix_kb_chunks_hnsw_{DIM}"
HNSW_DDL = (
    f"CREATE INDEX IF NOT EXISTS {HNSW_INDEX} ON kb_chunks "
    f"USING hnsw ((embedding::vector({DIM})) vector_cosine_ops) WHERE dim = {DIM}"
)
"""As the migration (0005) and `KnowledgeBase.ensure_collection` create it."""
EF_SEARCH = (40, 100)
"""hnsw.ef_search for the index probe: pgvector's default, and a larger one."""
TOOL_K = 4
"""What `search_knowledge_tool` asks for."""
RANK_K = 10
ABSTAIN_THRESHOLDS = (0.25, 0.35, 0.45)
DEFAULT_MIN_SIMILARITY = float(inspect.signature(search_knowledge_tool).parameters["min_similarity"].default)
"""What the search tool keeps by default."""
ROUTE_THRESHOLDS = (0.15, 0.25, 0.35)
TEXT_WEIGHTS = (0.25, 0.5, 0.75, 1.0)
"""Weights of the full-text ranking in the hybrid fusion to compare (the vector ranking's being 1)."""
LABELS = ("triage", "sales", "support", "human")
KINDS = ("exact", "paraphrase")

Sessions = async_sessionmaker[AsyncSession]
T = TypeVar("T")
Vectors = NDArray[np.float32]


@dataclass(frozen=True)
class Params:
    quick: bool
    latency_queries: int
    """Hybrid searches at the sample's size."""
    synthetic_queries: int
    """Hybrid and vector-only searches on the synthetic collection (full-text only: every third of them)."""
    synthetic_chunks: int
    live_insert_chunks: int
    """Of synthetic_chunks, how many are inserted after the HNSW index is built (the rest before it)."""
    index_probes: int
    seqscan_queries: int
    embed_every: int
    """The model-alone figure encodes every n-th chunk text by length (so its batches of 32 are padded as
    when it encodes them all), to keep the run short."""
    chunks_per_document: int = 100
    words_per_chunk: int = 80
    maintenance_work_mem: str = "512MB"
    seed: int = 7

    @classmethod
    def of(cls, quick: bool) -> Params:
        if quick:
            return cls(
                quick=True,
                latency_queries=50,
                synthetic_queries=30,
                synthetic_chunks=20_000,
                live_insert_chunks=500,
                index_probes=20,
                seqscan_queries=5,
                embed_every=4,
            )
        return cls(
            quick=False,
            latency_queries=200,
            synthetic_queries=100,
            synthetic_chunks=100_000,
            live_insert_chunks=1_000,
            index_probes=50,
            seqscan_queries=10,
            embed_every=2,
        )


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    collection: str | None
    document: str | None
    section: str | None
    kind: str

    @property
    def answerable(self) -> bool:
        return self.kind != "unanswerable"

    def is_right(self, hit: Hit) -> bool:
        """Its document, and its section when the question names one (chargers.txt has no headings)."""
        return hit.source == self.document and (self.section is None or hit.heading == self.section)


@dataclass(frozen=True)
class RoutingCase:
    message: str
    label: str


def load_questions() -> list[Question]:
    rows = [json.loads(line) for line in (DATA / "kb_eval.jsonl").read_text().splitlines() if line.strip()]
    return [Question(**row) for row in rows]


def load_routing() -> list[RoutingCase]:
    rows = [json.loads(line) for line in (DATA / "routing.jsonl").read_text().splitlines() if line.strip()]
    return [RoutingCase(message=row["message"], label=row["agent"]) for row in rows]


def sample_paths(collection: str) -> list[Path]:
    return find_documents([SAMPLE / collection])


def chunk_texts() -> list[str]:
    """What ingestion embeds, chunk by chunk, for both collections."""
    return [
        piece.embedding_text
        for collection in COLLECTIONS
        for path in sample_paths(collection)
        for piece in chunk_document(read_document(path, source=str(path.relative_to(SAMPLE))))
    ]


# ------------------------------------------------------------------------------------------------ embedders


class TimedEmbedder:
    """The wrapped embedder, recording how long each call took."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.calls_ms: list[float] = []

    async def embed(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = await self.inner.embed(texts)
        self.calls_ms.append((time.perf_counter() - started) * 1000)
        return vectors


class CachedEmbedder:
    """The wrapped embedder, each text embedded once: the quality figures search every question many times."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.cache: dict[str, list[float]] = {}

    async def embed(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            self.cache.update(zip(missing, await self.inner.embed(missing), strict=True))
        return [self.cache[t] for t in texts]


class RandomEmbedder:
    """Random unit vectors: the synthetic collection's "embedder" (its texts are random words)."""

    name = f"bench:random-{DIM}"
    dim = DIM

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in unit_vectors(self.rng, len(texts))]


def unit_vectors(rng: np.random.Generator, n: int) -> Vectors:
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


# ------------------------------------------------------------------------------------------------ process


def rss_mb() -> dict[str, float]:
    """Resident set size now and at its peak (VmHWM), from /proc (Linux); empty elsewhere."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    found = {key: float(value) / 1024 for key, value in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return {"rss": round(found.get("VmRSS", 0.0), 1), "peak": round(found.get("VmHWM", 0.0), 1)}


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ------------------------------------------------------------------------------------------------ set-up


@dataclass
class StatementLog:
    """The last vector and full-text statements `KnowledgeBase.search` sent, with their parameters, so that
    EXPLAIN runs the product's own SQL rather than a copy of it."""

    vector: tuple[str, tuple[Any, ...]] | None = None
    text: tuple[str, tuple[Any, ...]] | None = None

    def listen(self, engine: AsyncEngine) -> None:
        def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            if "kb_chunks" not in statement:
                return
            params = tuple(parameters) if isinstance(parameters, (list, tuple)) else (parameters,)
            if "<=>" in statement:
                self.vector = (statement, params)
            elif "ts_rank_cd" in statement:
                self.text = (statement, params)

        event.listen(engine.sync_engine, "before_cursor_execute", record)


@dataclass
class Bench:
    url: str
    engine: AsyncEngine
    sessions: Sessions
    raw: asyncpg.Connection
    statements: StatementLog
    model: MiniLM
    local: LocalEmbedder
    cached: CachedEmbedder
    model_load_s: float
    rss_before_model_mb: dict[str, float]
    rss_after_model_mb: dict[str, float]
    custom_engine: AsyncEngine
    """Connections that always plan each statement for its parameters (plan_cache_mode=force_custom_plan)."""
    quality_kb: KnowledgeBase = field(init=False)
    custom_kb: KnowledgeBase = field(init=False)

    def __post_init__(self) -> None:
        self.quality_kb = KnowledgeBase(sessions=self.sessions, embedder=self.cached)
        self.custom_kb = KnowledgeBase(sessions=make_sessions(self.custom_engine), embedder=self.cached)


@asynccontextmanager
async def bench_environment(server_url: str) -> AsyncIterator[Bench]:
    async with throwaway_database(server_url) as url:
        engine = make_engine(url, pool_size=5)
        custom_engine = create_async_engine(
            async_url(url), connect_args={"server_settings": {"plan_cache_mode": "force_custom_plan"}}
        )
        statements = StatementLog()
        statements.listen(engine)
        raw = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
        try:
            await register_vector(raw)
            before = rss_mb()
            started = time.perf_counter()
            model = MiniLM()
            model.encode(["warm-up"])
            load_s = time.perf_counter() - started
            local = LocalEmbedder(model)
            yield Bench(
                url=url,
                engine=engine,
                sessions=make_sessions(engine),
                raw=raw,
                statements=statements,
                model=model,
                local=local,
                cached=CachedEmbedder(local),
                model_load_s=load_s,
                rss_before_model_mb=before,
                rss_after_model_mb=rss_mb(),
                custom_engine=custom_engine,
            )
        finally:
            await raw.close()
            await engine.dispose()
            await custom_engine.dispose()


async def explain(raw: asyncpg.Connection, captured: tuple[str, tuple[Any, ...]] | None) -> dict[str, Any]:
    """EXPLAIN ANALYZE of a captured statement: its plan lines, and whether it scanned the HNSW index."""
    if captured is None:
        return {"plan": [], "uses_hnsw": False}
    statement, params = captured
    rows = await raw.fetch(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) {statement}", *bind(params))
    plan = [re.sub(r"'\[[^\]]{200,}\]'", "'[query vector]'", str(r[0])) for r in rows]
    return {"plan": plan, "uses_hnsw": any(HNSW_INDEX in line for line in plan)}


def spread(items: Sequence[T], count: int) -> list[T]:
    """`count` of the items: all of them over and over when there are fewer, else evenly spaced."""
    if count >= len(items):
        return [items[i % len(items)] for i in range(count)]
    return [items[i * len(items) // count] for i in range(count)]


async def timed_ms(calls: Iterable[Callable[[], Awaitable[object]]]) -> list[float]:
    out: list[float] = []
    for call in calls:
        started = time.perf_counter()
        await call()
        out.append((time.perf_counter() - started) * 1000)
    return out


# ------------------------------------------------------------------------------------------------ ingestion


async def ingestion(bench: Bench, params: Params) -> dict[str, Any]:
    """The sample into fresh collections with the local embedder, then again (nothing changed); the embedder's
    own share of it; then the model alone (`MiniLM.encode`) on a subset of the chunk texts spread by length."""
    timed = TimedEmbedder(bench.local)
    kb = KnowledgeBase(sessions=bench.sessions, embedder=timed)
    documents = chunks = 0
    started, cpu = time.perf_counter(), time.process_time()
    for collection in COLLECTIONS:
        report = await kb.ingest(sample_paths(collection), collection=collection, root=SAMPLE)
        documents += report.added
        chunks += report.chunks
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    embed_s = sum(timed.calls_ms) / 1000
    started = time.perf_counter()
    unchanged = 0
    for collection in COLLECTIONS:
        unchanged += (await kb.ingest(sample_paths(collection), collection=collection, root=SAMPLE)).unchanged
    again_s = time.perf_counter() - started
    rss_after_ingest = rss_mb()

    texts = sorted(chunk_texts(), key=len)
    tokens = [sum(e.attention_mask) for e in bench.model.tokenizer.encode_batch(texts)]
    subset, subset_tokens = texts[:: params.embed_every], tokens[:: params.embed_every]
    started, alone_cpu = time.perf_counter(), time.process_time()
    bench.model.encode(subset)
    alone_s, alone_cpu = time.perf_counter() - started, time.process_time() - alone_cpu
    return {
        "documents": documents,
        "chunks": chunks,
        "elapsed_s": round(elapsed, 2),
        "documents_per_s": round(documents / elapsed, 2),
        "chunks_per_s": round(chunks / elapsed, 2),
        "process_cpu_utilisation": round(cpu / elapsed, 2),
        "reingest_unchanged": {"documents": unchanged, "elapsed_s": round(again_s, 3)},
        "embedding_in_ingestion": {
            "calls": len(timed.calls_ms),
            "sentences": len(texts),
            "tokens_mean": round(sum(tokens) / len(tokens), 1),
            "tokens_max": max(tokens),
            "elapsed_s": round(embed_s, 2),
            "share_of_ingestion": round(embed_s / elapsed, 3),
            "sentences_per_s": round(len(texts) / embed_s, 2),
            "tokens_per_s": round(sum(tokens) / embed_s, 1),
        },
        "embedder_alone": {
            "model": MODEL,
            "sentences": len(subset),
            "of_every": params.embed_every,
            "tokens_mean": round(sum(subset_tokens) / len(subset_tokens), 1),
            "elapsed_s": round(alone_s, 2),
            "sentences_per_s": round(len(subset) / alone_s, 2),
            "tokens_per_s": round(sum(subset_tokens) / alone_s, 1),
            "process_cpu_utilisation": round(alone_cpu / alone_s, 2),
        },
        "model": {
            "load_s": round(bench.model_load_s, 2),
            "rss_mb_before_loading": bench.rss_before_model_mb,
            "rss_mb_after_loading": bench.rss_after_model_mb,
            "rss_mb_after_ingestion": rss_after_ingest,
            "rss_mb_after_embedder_alone": rss_mb(),
        },
    }


# ------------------------------------------------------------------------------------------------ quality


def rank_of(question: Question, hits: Sequence[Hit]) -> int | None:
    return next((n for n, hit in enumerate(hits, 1) if question.is_right(hit)), None)


def rank_scores(ranks: Sequence[int | None]) -> dict[str, Any]:
    n = len(ranks)
    if not n:
        return {"questions": 0}
    return {
        "questions": n,
        "recall_at_1": round(sum(1 for r in ranks if r == 1) / n, 3),
        "recall_at_5": round(sum(1 for r in ranks if r is not None and r <= 5) / n, 3),
        "mrr_at_10": round(sum(1 / r for r in ranks if r is not None) / n, 3),
        "not_found_in_10": sum(1 for r in ranks if r is None),
    }


async def check_eval(bench: Bench, questions: Sequence[Question]) -> list[str]:
    """Eval entries that cannot be right whatever the search does: unknown document or section heading."""
    async with bench.sessions() as s:
        rows = (
            await s.execute(
                text("SELECT DISTINCT d.source, c.heading FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id")
            )
        ).all()
    headings: dict[str, set[str | None]] = {}
    for source, heading in rows:
        headings.setdefault(str(source), set()).add(heading)
    problems: list[str] = []
    for q in questions:
        if not q.answerable:
            continue
        if q.document not in headings:
            problems.append(f"{q.id}: document {q.document!r} is not in the knowledge base")
        elif q.collection != q.document.split("/")[0]:
            problems.append(f"{q.id}: document {q.document!r} is not in collection {q.collection!r}")
        elif q.section is None and headings[q.document] != {None}:
            problems.append(f"{q.id}: no section, but {q.document} has headings (any chunk of it counts)")
        elif q.section is not None and q.section not in headings[q.document]:
            problems.append(f"{q.id}: section {q.section!r} is no chunk heading of {q.document}")
    return problems


async def rank_all(kb: KnowledgeBase, questions: Sequence[Question], mode: Mode) -> list[int | None]:
    return [
        rank_of(q, await kb.search(q.question, collections=[q.collection or ""], k=RANK_K, mode=mode))
        for q in questions
    ]


def _spread(values: Sequence[float]) -> dict[str, float]:
    s = sorted(values)
    pick = {"min": 0.0, "p10": 0.1, "p50": 0.5, "p90": 0.9, "max": 1.0}
    return {k: round(s[min(len(s) - 1, round(q * (len(s) - 1)))], 3) for k, q in pick.items()} if s else {}


async def quality(bench: Bench, questions: Sequence[Question]) -> dict[str, Any]:
    kb = bench.quality_kb
    answerable = [q for q in questions if q.answerable]
    unanswerable = [q for q in questions if not q.answerable]
    modes: dict[str, Any] = {}
    failures: list[dict[str, Any]] = []
    per_question: dict[str, dict[str, int | None]] = {q.id: {} for q in answerable}
    for mode in ("vector", "text", "hybrid"):
        ranks = await rank_all(kb, answerable, mode)
        for q, r in zip(answerable, ranks, strict=True):
            per_question[q.id][mode] = r
        modes[mode] = {
            "all": rank_scores(ranks),
            **{
                kind: rank_scores([r for q, r in zip(answerable, ranks, strict=True) if q.kind == kind])
                for kind in KINDS
            },
            **{
                f"collection:{c}": rank_scores([r for q, r in zip(answerable, ranks, strict=True) if q.collection == c])
                for c in COLLECTIONS
            },
        }
        if mode == "hybrid":
            for q, r in zip(answerable, ranks, strict=True):
                if r is None or r > 1:
                    top = (await kb.search(q.question, collections=[q.collection or ""], k=1))[0]
                    failures.append(
                        {
                            "id": q.id,
                            "kind": q.kind,
                            "question": q.question,
                            "expected": f"{q.document} › {q.section}" if q.section else q.document,
                            "rank": r,
                            "top_hit": f"{top.source} › {top.heading}" if top.heading else top.source,
                        }
                    )

    # Abstention: the tool's own filter over the hits it takes.
    answer_hits = [await kb.search(q.question, collections=[q.collection or ""], k=TOOL_K) for q in answerable]
    refuse_hits = [[await kb.search(q.question, collections=[c], k=TOOL_K) for c in COLLECTIONS] for q in unanswerable]
    thresholds: list[dict[str, Any]] = []
    for threshold in sorted({*ABSTAIN_THRESHOLDS, DEFAULT_MIN_SIMILARITY}):
        kept = [relevant(hits, q.question, threshold) for q, hits in zip(answerable, answer_hits, strict=True)]
        abstained = [
            all(not relevant(hits, q.question, threshold) for hits in per_collection)
            for q, per_collection in zip(unanswerable, refuse_hits, strict=True)
        ]
        thresholds.append(
            {
                "threshold": threshold,
                "unanswerable_abstained": round(sum(abstained) / len(abstained), 3) if abstained else None,
                "answerable_wrongly_abstained": round(sum(1 for k in kept if not k) / len(kept), 3),
                "answerable_right_passage_kept": round(
                    sum(1 for q, k in zip(answerable, kept, strict=True) if any(q.is_right(h) for h in k)) / len(kept),
                    3,
                ),
                "unanswerable_answered": [q.id for q, a in zip(unanswerable, abstained, strict=True) if not a],
            }
        )
    top_answerable = [
        (await kb.search(q.question, collections=[q.collection or ""], k=1, mode="vector"))[0].similarity or 0.0
        for q in answerable
    ]
    top_unanswerable: list[float] = []
    for q in unanswerable:
        per_collection = [(await kb.search(q.question, collections=[c], k=1, mode="vector"))[0] for c in COLLECTIONS]
        top_unanswerable.append(max(hit.similarity or 0.0 for hit in per_collection))
    return {
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "by_kind": dict(Counter(q.kind for q in questions)),
        "rank_k": RANK_K,
        "modes": modes,
        "hybrid_misses_at_1": failures,
        "ranks": per_question,
        "abstention": {
            "hits_per_search": TOOL_K,
            "default_threshold": DEFAULT_MIN_SIMILARITY,
            "thresholds": thresholds,
            "top_similarity_answerable": _spread(top_answerable),
            "top_similarity_unanswerable": _spread(top_unanswerable),
        },
    }


async def quality_hybrid(bench: Bench, questions: Sequence[Question]) -> dict[str, Any]:
    answerable = [q for q in questions if q.answerable]
    return rank_scores(await rank_all(bench.quality_kb, answerable, "hybrid"))


async def quality_custom_plans(bench: Bench, questions: Sequence[Question]) -> dict[str, Any]:
    """Vector and hybrid quality again on connections that never use a cached generic plan, and the vector
    candidates a catalogue search then gets: what the plan cache costs."""
    answerable = [q for q in questions if q.answerable]
    vector = await rank_all(bench.custom_kb, answerable, "vector")
    hybrid = await rank_all(bench.custom_kb, answerable, "hybrid")
    weights: list[dict[str, Any]] = []
    for weight in sorted({*TEXT_WEIGHTS, TEXT_WEIGHT}):
        kb = KnowledgeBase(sessions=bench.custom_kb.sessions, embedder=bench.cached, text_weight=weight)
        ranks = await rank_all(kb, answerable, "hybrid")
        weights.append(
            {
                "text_weight": weight,
                "default": weight == TEXT_WEIGHT,
                "all": rank_scores(ranks),
                **{
                    kind: rank_scores([r for q, r in zip(answerable, ranks, strict=True) if q.kind == kind])
                    for kind in KINDS
                },
            }
        )
    return {
        "vector": rank_scores(vector),
        "hybrid": rank_scores(hybrid),
        "hybrid_text_weight_sweep": weights,
        "ranks": {q.id: {"vector": v, "hybrid": h} for q, v, h in zip(answerable, vector, hybrid, strict=True)},
        "catalogue_vector_candidates": await vector_candidates(bench, questions, "catalogue", bench.custom_kb),
        "support_vector_candidates": await vector_candidates(bench, questions, "support", bench.custom_kb),
    }


# ------------------------------------------------------------------------------------------------ routing


async def routing(bench: Bench, cases: Sequence[RoutingCase]) -> dict[str, Any]:
    roster = default_roster()
    router = SimilarityRouter(bench.local, {name: agent.description for name, agent in roster.agents.items()})
    default_score = OfflineModel(router).min_route_score
    thresholds = sorted({*ROUTE_THRESHOLDS, default_score})
    routed: list[tuple[RoutingCase, str | None, float | None]] = []
    for case in cases:
        if ASKS_FOR_PERSON.search(case.message):
            routed.append((case, None, None))
        else:
            route = await router.route(case.message)
            routed.append((case, route.agent, route.score))

    def decide(target: str | None, score: float | None, threshold: float) -> str:
        if target is None or score is None:
            return "human"
        return target if target != roster.entry and score >= threshold else roster.entry

    sweep: list[dict[str, Any]] = []
    for threshold in thresholds:
        predicted = [decide(t, s, threshold) for _, t, s in routed]
        per_label = {
            label: round(
                sum(1 for (c, _, _), p in zip(routed, predicted, strict=True) if c.label == label and p == label)
                / max(1, sum(1 for c, _, _ in routed if c.label == label)),
                3,
            )
            for label in LABELS
        }
        confusion = {
            label: {
                p: sum(1 for (c, _, _), x in zip(routed, predicted, strict=True) if c.label == label and x == p)
                for p in LABELS
            }
            for label in LABELS
        }
        sweep.append(
            {
                "threshold": threshold,
                "accuracy": round(
                    sum(1 for (c, _, _), p in zip(routed, predicted, strict=True) if c.label == p) / len(routed), 3
                ),
                "per_label": per_label,
                "confusion": confusion,
            }
        )
    default = next(s for s in sweep if s["threshold"] == default_score)
    # The offline model's router: the agent owning the most similar passage when it counts as found, else the
    # description route above.
    grounded = SimilarityRouter(
        bench.cached,
        {name: agent.description for name, agent in roster.agents.items()},
        knowledge=bench.quality_kb,
        collections=KNOWLEDGE_OF,
        min_passage_similarity=DEFAULT_MIN_SIMILARITY,
    )
    first: list[tuple[RoutingCase, str]] = []
    for case in cases:
        if ASKS_FOR_PERSON.search(case.message):
            first.append((case, "human"))
            continue
        route = await grounded.route(case.message)
        transfer = route.basis == "passage" or route.score >= default_score
        first.append((case, route.agent if transfer else roster.entry))
    knowledge_first = {
        "accuracy": round(sum(1 for c, p in first if c.label == p) / len(first), 3),
        "per_label": {
            label: round(
                sum(1 for c, p in first if c.label == label and p == label)
                / max(1, sum(1 for c, _ in first if c.label == label)),
                3,
            )
            for label in LABELS
        },
        "confusion": {
            label: {x: sum(1 for c, p in first if c.label == label and p == x) for x in LABELS} for label in LABELS
        },
        "wrong": [{"message": c.message, "label": c.label, "routed": p} for c, p in first if c.label != p],
    }
    messages = [
        {
            "message": c.message,
            "label": c.label,
            "nearest": t,
            "score": None if s is None else round(s, 3),
            "routed": decide(t, s, default_score),
        }
        for c, t, s in routed
    ]
    return {
        "messages": len(cases),
        "by_label": dict(Counter(c.label for c in cases)),
        "descriptions": {name: agent.description for name, agent in roster.agents.items()},
        "default_threshold": default_score,
        "accuracy": default["accuracy"],
        "per_label": default["per_label"],
        "confusion": default["confusion"],
        "sweep": sweep,
        "wrong": [m for m in messages if m["routed"] != m["label"]],
        "all": messages,
        "knowledge_first": knowledge_first,
    }


# ------------------------------------------------------------------------------------------------ latency


async def latency_sample(bench: Bench, questions: Sequence[Question], params: Params) -> dict[str, Any]:
    """Hybrid search as the tool runs it (k=4, the question's collection or both), query embedding included."""
    timed = TimedEmbedder(bench.local)
    kb = KnowledgeBase(sessions=bench.sessions, embedder=timed)
    queries = spread(questions, params.latency_queries)

    def call(q: Question) -> Callable[[], Awaitable[object]]:
        collections = [q.collection] if q.collection else list(COLLECTIONS)
        return lambda: kb.search(q.question, collections=collections, k=TOOL_K)

    await timed_ms(call(q) for q in queries[:5])
    timed.calls_ms.clear()
    total = await timed_ms(call(q) for q in queries)
    embedding = list(timed.calls_ms)
    rest = [t - e for t, e in zip(total, embedding, strict=True)]
    async with bench.sessions() as s:
        chunks = int((await s.execute(text("SELECT count(*) FROM kb_chunks"))).scalar_one())
    # The plans below are those of a search in one collection (the agents search one each).
    catalogue = next(q for q in questions if q.collection == "catalogue")
    await kb.search(catalogue.question, collections=["catalogue"], k=TOOL_K)
    return {
        "chunks": chunks,
        "queries": len(queries),
        "k": TOOL_K,
        "total_ms": summary(total),
        "embedding_ms": summary(embedding),
        "search_ms": summary(rest),
        "catalogue_vector_plan": await explain(bench.raw, bench.statements.vector),
        "catalogue_vector_generic_plan": await generic_plan(bench.raw, bench.statements.vector),
        "catalogue_vector_candidates": await vector_candidates(bench, questions, "catalogue"),
    }


def vocabulary(rng: np.random.Generator) -> tuple[list[str], NDArray[np.float64]]:
    """The sample's words, in a random order with Zipf-like weights: common words match many chunks."""
    words: set[str] = set()
    for path in find_documents([SAMPLE]):
        words.update(re.findall(r"[a-z][a-z0-9-]{2,}", path.read_text(encoding="utf-8", errors="replace").lower()))
    ordered = sorted(words)
    rng.shuffle(ordered)
    weights = 1.0 / np.arange(1, len(ordered) + 1, dtype=np.float64)
    return ordered, weights / weights.sum()


def synthetic_texts(rng: np.random.Generator, n: int, words: int) -> tuple[list[str], list[str], int]:
    """Chunk texts and headings drawn from `vocabulary`; and its size."""
    vocab, weights = vocabulary(rng)
    picks = rng.choice(len(vocab), size=(n, words + 4), p=weights)
    texts = [" ".join(vocab[i] for i in row[4:]) + "." for row in picks]
    headings = [" ".join(vocab[i] for i in row[:4]).capitalize() for row in picks]
    return texts, headings, len(vocab)


async def copy_chunks(
    raw: asyncpg.Connection,
    documents: Sequence[int],
    texts: Sequence[str],
    headings: Sequence[str],
    vectors: Vectors,
    start: int,
    stop: int,
    params: Params,
) -> None:
    per = params.chunks_per_document
    records = (
        (
            documents[i // per],
            SYNTHETIC,
            i % per,
            f"Synthetic document {i // per}",
            headings[i],
            texts[i],
            DIM,
            vectors[i],
        )
        for i in range(start, stop)
    )
    await raw.copy_records_to_table(
        "kb_chunks",
        records=records,
        columns=["document_id", "collection", "ordinal", "title", "heading", "text", "dim", "embedding"],
    )


async def latency_synthetic(bench: Bench, questions: Sequence[Question], params: Params) -> dict[str, Any]:
    rng = np.random.default_rng(params.seed)
    n = params.synthetic_chunks
    kb = KnowledgeBase(sessions=bench.sessions, embedder=RandomEmbedder(params.seed + 1))
    await kb.ensure_collection(SYNTHETIC)

    started = time.perf_counter()
    vectors = unit_vectors(rng, n)
    texts, headings, vocab_size = synthetic_texts(rng, n, params.words_per_chunk)
    generate_s = time.perf_counter() - started

    raw = bench.raw
    documents = [
        int(r[0])
        for r in await raw.fetch(
            "INSERT INTO kb_documents (collection, source, title, content_hash) "
            "SELECT $1, 'synthetic/doc-' || g || '.md', 'Synthetic document ' || g, md5(g::text) "
            "FROM generate_series(0, $2 - 1) g ORDER BY g RETURNING id",
            SYNTHETIC,
            -(-n // params.chunks_per_document),
        )
    ]
    bulk = n - params.live_insert_chunks
    sample_chunks = int(
        await raw.fetchval("SELECT count(*) FROM kb_chunks WHERE collection = ANY($1)", list(COLLECTIONS))
    )
    await raw.execute(f"DROP INDEX IF EXISTS {HNSW_INDEX}")
    started = time.perf_counter()
    await copy_chunks(raw, documents, texts, headings, vectors, 0, bulk, params)
    copy_s = time.perf_counter() - started
    await raw.execute(f"SET maintenance_work_mem = '{params.maintenance_work_mem}'")
    workers = await raw.fetchval("SELECT current_setting('max_parallel_maintenance_workers')")
    started = time.perf_counter()
    await raw.execute(HNSW_DDL)
    build_s = time.perf_counter() - started
    await raw.execute("RESET maintenance_work_mem")
    started = time.perf_counter()
    await copy_chunks(raw, documents, texts, headings, vectors, bulk, n, params)
    live_s = time.perf_counter() - started
    await raw.execute("ANALYZE kb_chunks")
    await raw.execute("ANALYZE kb_documents")
    sizes = await raw.fetchrow(
        "SELECT pg_total_relation_size('kb_chunks') AS total, pg_relation_size($1::regclass) AS hnsw, "
        "pg_relation_size('ix_kb_chunks_tsv') AS gin",
        HNSW_INDEX,
    )
    assert sizes is not None

    # The product's SQL, captured from one search, explained; then the latencies.
    texts_q = [q.question for q in questions]
    await kb.search(texts_q[0], collections=[SYNTHETIC], k=TOOL_K)
    vector_plan = await explain(raw, bench.statements.vector)
    vector_generic = await generic_plan(raw, bench.statements.vector)
    text_plan = await explain(raw, bench.statements.text)
    # The modes interleaved query by query (full text on every third), so that a change in the machine's load
    # weighs on all three alike.
    modes: tuple[Mode, ...] = ("hybrid", "vector", "text")
    timings: dict[Mode, list[float]] = {mode: [] for mode in modes}
    queries = spread(texts_q, params.synthetic_queries)
    for mode in modes:
        for q in queries[:3]:
            await kb.search(q, collections=[SYNTHETIC], k=TOOL_K, mode=mode)
    for index, q in enumerate(queries):
        for mode in modes:
            if mode == "text" and index % 3:
                continue
            started = time.perf_counter()
            await kb.search(q, collections=[SYNTHETIC], k=TOOL_K, mode=mode)
            timings[mode].append((time.perf_counter() - started) * 1000)
    latencies = {mode: {"queries": len(ms), "ms": summary(ms)} for mode, ms in timings.items()}

    matches = [
        int(
            await raw.fetchval(
                "SELECT count(*) FROM kb_chunks c WHERE c.collection = $2 AND c.tsv @@ "
                "to_tsquery('english', replace(plainto_tsquery('english', $1)::text, '&', '|'))",
                q,
                SYNTHETIC,
            )
        )
        for q in spread(texts_q, 20)
    ]
    return {
        "chunks": n,
        "documents": len(documents),
        "words_per_chunk": params.words_per_chunk,
        "vocabulary": vocab_size,
        "generate_s": round(generate_s, 2),
        "copy": {"rows": bulk, "elapsed_s": round(copy_s, 2), "rows_per_s": round(bulk / copy_s, 1)},
        "hnsw_build": {
            "elapsed_s": round(build_s, 2),
            "rows": bulk + sample_chunks,
            "maintenance_work_mem": params.maintenance_work_mem,
            "max_parallel_maintenance_workers": int(workers),
        },
        "insert_with_live_index": {
            "rows": n - bulk,
            "elapsed_s": round(live_s, 2),
            "rows_per_s": round((n - bulk) / live_s, 1) if live_s else None,
        },
        "sizes_mb": {k: round(int(sizes[k]) / 2**20, 1) for k in ("total", "hnsw", "gin")},
        "vector_plan": vector_plan,
        "vector_generic_plan": vector_generic,
        "text_plan": text_plan,
        "text_matches_per_query": _spread([float(m) for m in matches]),
        "latency": latencies,
        "index_probe": await index_probe(bench, params),
        "exact_scan_ms": await exact_scan(bench, params),
    }


def bind(params: tuple[Any, ...], vector: Vectors | None = None) -> tuple[Any, ...]:
    """A captured statement's parameters for the raw connection, whose pgvector codec wants arrays rather than
    the '[...]' text the store sends; with `vector`, that query vector instead of the captured one."""

    def one(p: Any) -> Any:
        if isinstance(p, str) and p.startswith("["):
            return vector if vector is not None else np.array(json.loads(p), dtype=np.float32)
        return p

    return tuple(one(p) for p in params)


async def index_probe(bench: Bench, params: Params) -> dict[str, Any]:
    """Stored vectors, slightly perturbed (cosine about 0.9 to the original), searched with the product's
    vector SQL: the original should come first, which an index that works finds."""
    captured = bench.statements.vector
    if captured is None:
        return {}
    statement, params_ = captured
    rows = await bench.raw.fetch(
        "SELECT id, embedding::vector(384) AS e FROM kb_chunks WHERE collection = $1 ORDER BY random() LIMIT $2",
        SYNTHETIC,
        params.index_probes,
    )
    rng = np.random.default_rng(params.seed + 2)
    probes: list[tuple[int, Vectors]] = []
    for row in rows:
        original = np.asarray(row["e"].to_numpy() if hasattr(row["e"], "to_numpy") else row["e"], dtype=np.float32)
        noisy = original + rng.standard_normal(DIM).astype(np.float32) * np.float32(0.48 / np.sqrt(DIM))
        probes.append((int(row["id"]), noisy / np.linalg.norm(noisy)))
    found_first: dict[str, int] = {}
    for ef_search in EF_SEARCH:
        first = 0
        async with bench.raw.transaction():
            await bench.raw.execute(f"SET LOCAL hnsw.ef_search = {ef_search}")
            for chunk_id, vector in probes:
                found = [r[0] for r in await bench.raw.fetch(statement, *bind(params_, vector))]
                first += bool(found) and found[0] == chunk_id
        found_first[str(ef_search)] = first
    return {"probes": len(probes), "found_first_by_ef_search": found_first}


async def exact_scan(bench: Bench, params: Params) -> dict[str, float]:
    """The vector query without the index (enable_indexscan off): what the HNSW index saves."""
    captured = bench.statements.vector
    if captured is None:
        return {}
    statement, params_ = captured
    rng = np.random.default_rng(params.seed + 3)
    out: list[float] = []
    async with bench.raw.transaction():
        # A statement text of its own: a prepared statement's cached plan ignores later settings.
        await bench.raw.execute("SET LOCAL enable_indexscan = off")
        await bench.raw.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        for vector in unit_vectors(rng, params.seqscan_queries):
            args = bind(params_, vector)
            started = time.perf_counter()
            await bench.raw.fetch(f"/* exact */ {statement}", *args)
            out.append((time.perf_counter() - started) * 1000)
    return summary(out)


async def vector_candidates(
    bench: Bench, questions: Sequence[Question], collection: str, kb: KnowledgeBase | None = None
) -> dict[str, Any]:
    """How many passages the vector half of the search returns for questions on `collection` (mode="vector",
    k=CANDIDATES), asked repeatedly as the agents would: fewer than CANDIDATES (or than the collection has)
    means the HNSW index was scanned and other collections' rows were filtered out after it."""
    asked = [q for q in questions if q.collection == collection][:12]
    counts = [
        len(await (kb or bench.quality_kb).search(q.question, collections=[collection], k=CANDIDATES, mode="vector"))
        for q in asked
    ]
    async with bench.sessions() as s:
        size = int(
            (
                await s.execute(text("SELECT count(*) FROM kb_chunks WHERE collection = :c"), {"c": collection})
            ).scalar_one()
        )
    return {
        "collection": collection,
        "collection_chunks": size,
        "expected": min(CANDIDATES, size),
        "searches": len(counts),
        "counts": counts,
        "short": sum(1 for c in counts if c < min(CANDIDATES, size)),
    }


async def generic_plan(raw: asyncpg.Connection, captured: tuple[str, tuple[Any, ...]] | None) -> dict[str, Any]:
    """The plan Postgres caches for the statement once it settles on a generic plan (after five executions
    on a connection, when that looks no costlier): what a pooled connection then runs for every collection."""
    if captured is None:
        return {"plan": [], "uses_hnsw": False}
    statement, params = captured

    def literal(p: Any) -> str:
        if isinstance(p, (list, tuple)):
            return "ARRAY[" + ", ".join(literal(x) for x in p) + "]::text[]"
        if isinstance(p, str):
            return "'" + p.replace("'", "''") + "'"
        return str(p)

    await raw.execute(f"PREPARE bench_generic AS {statement}")
    try:
        async with raw.transaction():
            await raw.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            args = ", ".join(literal(p) for p in params)
            rows = await raw.fetch(f"EXPLAIN (COSTS OFF) EXECUTE bench_generic({args})")
    finally:
        await raw.execute("DEALLOCATE bench_generic")
    plan = [str(r[0]) for r in rows]
    return {"plan": plan, "uses_hnsw": any(HNSW_INDEX in line for line in plan)}


async def beside_synthetic(bench: Bench, questions: Sequence[Question]) -> dict[str, Any]:
    """The sample's retrieval quality again, now that the table also holds the synthetic collection; and the
    plans of the vector query for a small collection."""
    scores = await quality_hybrid(bench, questions)
    q = next(q for q in questions if q.collection == "catalogue")
    await bench.quality_kb.search(q.question, collections=["catalogue"], k=TOOL_K)
    return {
        "hybrid": scores,
        "catalogue_vector_plan": await explain(bench.raw, bench.statements.vector),
        "catalogue_vector_generic_plan": await generic_plan(bench.raw, bench.statements.vector),
        "catalogue_vector_candidates": await vector_candidates(bench, questions, "catalogue"),
    }


# ------------------------------------------------------------------------------------------------ report


def print_ingestion(f: dict[str, Any]) -> None:
    section("Ingestion of the sample with the local embedder (fresh collections)")
    e, a, m = f["embedding_in_ingestion"], f["embedder_alone"], f["model"]
    print(
        f"{f['documents']} documents, {f['chunks']} chunks in {f['elapsed_s']:.2f} s: "
        f"{f['documents_per_s']} documents/s, {f['chunks_per_s']} chunks/s "
        f"({f['process_cpu_utilisation']:.0%} of one core); re-ingesting unchanged: "
        f"{f['reingest_unchanged']['elapsed_s']:.2f} s"
    )
    print(
        f"embedding: {e['share_of_ingestion']:.0%} of that time, {e['calls']} calls (one per document): "
        f"{e['sentences_per_s']} chunk texts/s, {e['tokens_per_s']:,.0f} tokens/s "
        f"({e['tokens_mean']} tokens per chunk on average, max {e['tokens_max']})"
    )
    print(
        f"model alone ({a['model']}, MiniLM.encode, every {a['of_every']}th chunk text by length): {a['sentences']} "
        f"texts in {a['elapsed_s']:.2f} s = {a['sentences_per_s']} sentences/s, {a['tokens_per_s']:,.0f} tokens/s, "
        f"{a['process_cpu_utilisation']:.0%} of one core"
    )
    print(
        f"model load {m['load_s']:.2f} s; process RSS before loading {m['rss_mb_before_loading'].get('rss')} MB, "
        f"after {m['rss_mb_after_loading'].get('rss')} MB, after ingestion {m['rss_mb_after_ingestion'].get('rss')} "
        f"MB (peak so far {m['rss_mb_after_ingestion'].get('peak')} MB)"
    )


def print_quality(f: dict[str, Any], problems: Sequence[str]) -> None:
    section(
        f"Retrieval quality on the sample: {f['answerable']} answerable questions, each in its collection, "
        "searched as the product does "
        f"(exact {f['by_kind'].get('exact', 0)}, paraphrase {f['by_kind'].get('paraphrase', 0)})"
    )
    rows: list[Sequence[object]] = []
    for mode in ("vector", "text", "hybrid"):
        for group in ("all", *KINDS):
            s = f["modes"][mode][group]
            rows.append(
                (
                    f"{mode} / {group}",
                    s["questions"],
                    s["recall_at_1"],
                    s["recall_at_5"],
                    s["mrr_at_10"],
                    s["not_found_in_10"],
                )
            )
    print(table(("mode / questions", "n", "recall@1", "recall@5", "MRR@10", "not in top 10"), rows))
    misses = f["hybrid_misses_at_1"]
    print(f"hybrid: {len(misses)} questions without the right passage first, e.g.:")
    for miss in misses[:6]:
        print(f"  {miss['id']} ({miss['kind']}, rank {miss['rank']}): {miss['question']!r} -> {miss['top_hit']}")
    for problem in problems:
        print(f"WARNING: eval entry {problem}")
    custom = f.get("custom_plans")
    if custom:
        v, h = custom["vector"], custom["hybrid"]
        c, sp = custom["catalogue_vector_candidates"], custom["support_vector_candidates"]
        print(
            f"with custom plans only (plan_cache_mode=force_custom_plan): vector recall@1 {v['recall_at_1']}, "
            f"@5 {v['recall_at_5']}, MRR {v['mrr_at_10']}; hybrid recall@1 {h['recall_at_1']}, @5 {h['recall_at_5']}, "
            f"MRR {h['mrr_at_10']}; vector candidates per catalogue search {min(c['counts'])}-{max(c['counts'])}, "
            f"per support search {min(sp['counts'])}-{max(sp['counts'])} (expected {c['expected']})"
        )
        print(
            "hybrid by the full-text ranking's weight in the fusion (custom plans): "
            + "; ".join(
                f"{w['text_weight']}{' (default)' if w['default'] else ''}: recall@1 {w['all']['recall_at_1']}, "
                f"@5 {w['all']['recall_at_5']}, MRR {w['all']['mrr_at_10']}"
                for w in custom["hybrid_text_weight_sweep"]
            )
        )

    a = f["abstention"]
    section(f"Abstention: relevant(hits, question, threshold) over the tool's {a['hits_per_search']} hybrid hits")
    print(
        table(
            (
                "min similarity",
                "unanswerable: abstains (right)",
                "answerable: abstains (wrong)",
                "answerable: right passage kept",
            ),
            [
                (
                    f"{t['threshold']:.2f}" + (" (default)" if t["threshold"] == a["default_threshold"] else ""),
                    f"{t['unanswerable_abstained']:.0%}",
                    f"{t['answerable_wrongly_abstained']:.0%}",
                    f"{t['answerable_right_passage_kept']:.0%}",
                )
                for t in a["thresholds"]
            ],
        )
    )
    ans, una = a["top_similarity_answerable"], a["top_similarity_unanswerable"]
    print(
        "best vector similarity, answerable: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ans.items())
        + "; unanswerable: "
        + ", ".join(f"{k} {v:.2f}" for k, v in una.items())
    )


def print_routing(f: dict[str, Any]) -> None:
    section(
        f"Routing: {f['messages']} messages, ASKS_FOR_PERSON then SimilarityRouter (transfer at score >= "
        f"{f['default_threshold']})"
    )
    print(
        f"accuracy {f['accuracy']:.0%}; per label: "
        + ", ".join(f"{label} {acc:.0%}" for label, acc in f["per_label"].items())
    )
    print(table(("expected \\ routed", *LABELS), [(label, *f["confusion"][label].values()) for label in LABELS]))
    print(
        "threshold sweep: "
        + "; ".join(
            f"{s['threshold']:.2f} -> {s['accuracy']:.0%} ("
            + ", ".join(f"{label} {acc:.0%}" for label, acc in s["per_label"].items())
            + ")"
            for s in f["sweep"]
        )
    )
    k = f["knowledge_first"]
    print(
        f"the offline model's router (the most similar passage's agent when it counts as found, else the above): "
        f"accuracy {k['accuracy']:.0%}; per label: "
        + ", ".join(f"{label} {acc:.0%}" for label, acc in k["per_label"].items())
    )
    print(f"{len(f['wrong'])} routed wrongly at {f['default_threshold']} (all in the JSON), e.g.:")
    for wrong in f["wrong"][:8]:
        print(
            f"  {wrong['label']} -> {wrong['routed']}: {wrong['message']!r} "
            f"(nearest {wrong['nearest']}, {wrong['score']})"
        )


def _ms_row(label: str, s: dict[str, float]) -> Sequence[object]:
    return (label, s["p50"], s["p90"], s["p99"], s["mean"], s["max"])


def print_latency_sample(f: dict[str, Any]) -> None:
    section(f"Search latency at the sample's size ({f['chunks']} chunks), {f['queries']} hybrid queries, k={f['k']}")
    print(
        table(
            ("ms per query", "p50", "p90", "p99", "mean", "max"),
            [
                _ms_row("total (query embedded)", f["total_ms"]),
                _ms_row("embedding the query", f["embedding_ms"]),
                _ms_row("search (SQL, fusion)", f["search_ms"]),
            ],
        )
    )
    c = f["catalogue_vector_candidates"]
    print(
        f"catalogue vector query uses {HNSW_INDEX}: {f['catalogue_vector_plan']['uses_hnsw']} (generic plan: "
        f"{f['catalogue_vector_generic_plan']['uses_hnsw']}); vector candidates per catalogue search: "
        f"{min(c['counts'])}-{max(c['counts'])} (expected {c['expected']})"
    )


def print_latency_synthetic(f: dict[str, Any], beside: dict[str, Any], before: dict[str, Any]) -> None:
    section(f"Synthetic collection: {f['chunks']:,} chunks of {f['words_per_chunk']} words, random {DIM}-d vectors")
    c, b, live = f["copy"], f["hnsw_build"], f["insert_with_live_index"]
    print(
        f"COPY of {c['rows']:,} chunks (no HNSW index): {c['elapsed_s']:.1f} s = {c['rows_per_s']:,.0f} rows/s; "
        f"HNSW build over {b['rows']:,} rows: {b['elapsed_s']:.1f} s "
        f"(maintenance_work_mem {b['maintenance_work_mem']}, "
        f"{b['max_parallel_maintenance_workers']} parallel workers); then {live['rows']:,} more with the index "
        f"live: {live['rows_per_s']:,.0f} rows/s"
    )
    sizes = f["sizes_mb"]
    print(f"sizes: kb_chunks total {sizes['total']} MB, HNSW {sizes['hnsw']} MB, GIN {sizes['gin']} MB")
    print(
        f"vector query uses {HNSW_INDEX}: {f['vector_plan']['uses_hnsw']} (generic plan: "
        f"{f['vector_generic_plan']['uses_hnsw']}); "
        "rows matching the OR-ed text query: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in f["text_matches_per_query"].items())
    )
    probe = f["index_probe"]
    if probe:
        print(
            "index probe (stored vector + noise, cosine ~0.9 to it): original found first in "
            + ", ".join(
                f"{n}/{probe['probes']} at hnsw.ef_search={ef}" + (" (default)" if ef == "40" else "")
                for ef, n in probe["found_first_by_ef_search"].items()
            )
        )
    rows = [_ms_row(f"{mode} ({v['queries']} queries)", v["ms"]) for mode, v in f["latency"].items()]
    if f["exact_scan_ms"]:
        rows.append(_ms_row("vector SQL, index disabled", f["exact_scan_ms"]))
    print(table(("ms per search (random query vector)", "p50", "p90", "p99", "mean", "max"), rows))
    h, c = beside["hybrid"], beside["catalogue_vector_candidates"]
    print(
        f"sample quality with it in the table (hybrid): recall@1 {h['recall_at_1']}, recall@5 {h['recall_at_5']}, "
        f"MRR {h['mrr_at_10']} (before: {before['recall_at_1']}, {before['recall_at_5']}, {before['mrr_at_10']})"
    )
    print(
        f"catalogue vector query uses {HNSW_INDEX}: {beside['catalogue_vector_plan']['uses_hnsw']} (generic plan: "
        f"{beside['catalogue_vector_generic_plan']['uses_hnsw']}); vector candidates per catalogue search: "
        f"{c['counts']} (expected {c['expected']})"
    )
    if c["short"]:
        print(
            f"WARNING: {c['short']} of {c['searches']} catalogue searches got fewer than {c['expected']} vector "
            "candidates: the HNSW index was scanned for all collections and the other collection's rows "
            "filtered out afterwards"
        )


def machine(database: str, server_version: str | None, pgvector: str | None) -> dict[str, Any]:
    return base_machine(
        database,
        server_version,
        pgvector=pgvector,
        numpy=np.__version__,
        asyncpg=asyncpg.__version__,
        blas_threads_env={k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
    )


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, database: str, params: Params) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = load_average()
    version = await admin(server_url, "SELECT current_setting('server_version')")
    pgvector = await admin(server_url, "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
    questions = load_questions()
    cases = load_routing()
    async with bench_environment(server_url) as bench:
        print(f"set-up (database, migrations, model): {time.perf_counter() - started:.1f} s", flush=True)
        ingest = await ingestion(bench, params)
        print_ingestion(ingest)
        problems = await check_eval(bench, questions)
        await bench.cached.embed([q.question for q in questions])
        quality_figures = await quality(bench, questions)
        quality_figures["custom_plans"] = await quality_custom_plans(bench, questions)
        print_quality(quality_figures, problems)
        routing_figures = await routing(bench, cases)
        print_routing(routing_figures)
        sample_latency = await latency_sample(bench, questions, params)
        print_latency_sample(sample_latency)
        print(f"\nloading {params.synthetic_chunks:,} synthetic chunks…", flush=True)
        synthetic = await latency_synthetic(bench, questions, params)
        beside = await beside_synthetic(bench, questions)
        print_latency_synthetic(synthetic, beside, quality_figures["modes"]["hybrid"]["all"])
    return {
        "benchmark": "knowledge",
        "machine": machine(database, version, pgvector),
        "load_average": {"start": load_start, "end": load_average()},
        "parameters": {
            **asdict(params),
            "embedder": LocalEmbedder.name,
            "sample": str(SAMPLE.relative_to(ROOT)),
            "collections": list(COLLECTIONS),
            "tool_k": TOOL_K,
            "text_weight": TEXT_WEIGHT,
            "min_similarity": DEFAULT_MIN_SIMILARITY,
            "rank_k": RANK_K,
        },
        "figures": {
            "ingestion": ingest,
            "eval_problems": problems,
            "quality": quality_figures,
            "routing": routing_figures,
            "latency_sample": sample_latency,
            "latency_synthetic": synthetic,
            "sample_quality_beside_synthetic": beside,
        },
        "total_s": round(time.perf_counter() - started, 1),
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the knowledge-base benchmark, print its tables and write `results/knowledge.json`."""
    quiet()
    params = Params.of(quick)
    print(f"knowledge benchmark{' (quick)' if quick else ''}: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    with postgres_server() as (server_url, database):
        report = asyncio.run(run(server_url, database, params))
    return write_report(report, results / "knowledge.json")
