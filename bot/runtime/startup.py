"""Start-up wiring: settings in, a ready database and engine out. Nothing here runs at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from yarl import URL

from agents.agent import Roster
from agents.context_window import context_window, history_budget
from agents.conversations import Conversations
from agents.db import migrate
from agents.db.embedded import start_embedded
from agents.db.engine import WriteHealth, make_engine, make_sessions, watch_writes
from agents.knowledge.documents import find_documents
from agents.knowledge.embedders import OpenAIEmbedder, Precomputed, Unavailable, probe
from agents.knowledge.local import LocalEmbedder
from agents.knowledge.multilingual import MultilingualEmbedder
from agents.knowledge.static import StaticEmbedder
from agents.knowledge.store import IngestFailed, KnowledgeBase
from agents.limits import Limits
from agents.loop import LLMCallRecord, LoopConfig
from agents.model import Model, OpenAIChatModel, provider_http
from agents.offline import FallbackModel, OfflineModel, SimilarityRouter
from agents.redaction import RedactingModel
from agents.router import Router
from agents.summary import Summarising
from bot import tracing
from bot.declaration.build import SAMPLE, Collection, Helpdesk, build, find
from bot.declaration.parse import load
from bot.settings import Settings
from bot.slack.preflight import RefusedToStart
from escalation.machine import TAKEOVER

log = logging.getLogger(__name__)


@dataclass
class Database:
    url: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    embedded: Any = None
    """The embedded server's handle, kept alive while the process needs it."""
    writes: WriteHealth = field(default_factory=WriteHealth)
    """Whether the server lately refused writes (a full disk): shown by /healthz."""


def database_url(settings: Settings) -> tuple[str, Any]:
    """The configured server, or the embedded one (never started when DATABASE_URL is set)."""
    if settings.database_url:
        return settings.database_url, None
    return start_embedded(settings.data_dir)


@asynccontextmanager
async def open_database(settings: Settings, *, run_migrations: bool = True) -> AsyncIterator[Database]:
    url, handle = await asyncio.to_thread(database_url, settings)
    pooler = settings.database_pooler == "transaction"
    if run_migrations and settings.migrate_at_start:
        await asyncio.to_thread(lambda: migrate.upgrade(url, transaction_pooler=pooler))
    elif run_migrations and (lag := await migrate.behind(url, transaction_pooler=pooler)) is not None:
        # Migrations are the release step's (MIGRATE_AT_START=false): a process never serves a schema it was not
        # written for, and its role needs no DDL rights.
        raise RefusedToStart(
            f"the database is at revision {lag[0] or 'none'} and this release needs {lag[1]}: run "
            "`python -m bot migrate` (the release step) first, or set MIGRATE_AT_START=true"
        )
    engine = make_engine(
        url, pool_size=settings.db_pool_size, transaction_pooler=settings.database_pooler == "transaction"
    )
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        yield Database(url, engine, make_sessions(engine), handle, watch_writes(engine))
    finally:
        await engine.dispose()


def listen_url(settings: Settings, url: str) -> str | None:
    """Where to LISTEN for new work: a pooler in transaction mode cannot; polling covers that case."""
    if settings.database_listen_url:
        return settings.database_listen_url
    return url if settings.database_pooler == "session" else None


def loop_config(settings: Settings, *, token_budget: int | None = None) -> LoopConfig:
    """`token_budget`: the history budget that fits the provider's context (`Brain.token_budget`)."""
    return LoopConfig(
        default_model=settings.openai_model,
        max_llm_calls=settings.max_llm_calls_per_message,
        max_handoffs=settings.max_handoffs_per_message,
        max_parallel_tools=settings.max_parallel_tools,
        token_budget=token_budget or settings.context_token_budget,
        stream=settings.stream_answers,
        texts=settings.texts,
    )


def summarising(settings: Settings, brain: Brain) -> Summarising | None:
    """Running summaries, made by the provider's model; none offline (the stand-in writes no summaries)."""
    if brain.offline or settings.history_tokens == 0:
        return None
    return Summarising(model=settings.summary_model or settings.openai_model, high_water=settings.history_tokens)


def limits(settings: Settings) -> Limits:
    return Limits(
        user_per_minute=settings.rate_limit_user_per_minute,
        channel_per_minute=settings.rate_limit_channel_per_minute,
        daily_tokens_per_user=settings.daily_token_budget_per_user,
    )


def provider_model(settings: Settings, chat: OpenAIChatModel) -> Model:
    """The provider's model as the bot calls it: with the values `REDACT` names replaced before they leave."""
    redactor = settings.redactor
    return RedactingModel(chat, redactor) if redactor is not None else chat


def chat_model(settings: Settings) -> OpenAIChatModel:
    return OpenAIChatModel(
        api_key=settings.openai_api_key.get_secret_value() if settings.openai_api_key else None,
        base_url=settings.openai_base_url,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        stream=settings.openai_stream,
    )


def _provider_client(settings: Settings, *, base_url: str | None, api_key: SecretStr | None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=api_key.get_secret_value() if api_key else "not-needed",
        base_url=base_url,
        timeout=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        http_client=provider_http(base_url),
    )


def shown_url(url: str | None) -> str:
    """A base URL as logs, /healthz and /support may show it: without credentials or query."""
    if not url:
        return "OpenAI"
    try:
        return str(URL(url).with_user(None).with_password(None).with_query(None).with_fragment(None))
    except ValueError:
        return "the configured URL"


async def knowledge_base(settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> KnowledgeBase:
    """The configured embedder, probed: one that does not work leaves the knowledge base on full-text search,
    logged with the reason and the fix (and shown by /healthz and /support status). With EMBEDDINGS=auto, a
    provider without embeddings gives way to the local model."""
    if settings.embeddings_source == "provider":
        base_url = settings.embeddings_base_url or settings.openai_base_url
        # The chat key goes only where the chat requests go: never to a separate embeddings server.
        api_key = settings.embeddings_api_key or (None if settings.embeddings_base_url else settings.openai_api_key)
        client = _provider_client(settings, base_url=base_url, api_key=api_key)
        redactor = settings.redactor
        remote = OpenAIEmbedder(
            client=client,
            model=settings.embeddings_model,
            dimensions=settings.embeddings_dim,
            # A customer's question goes to the provider's embeddings too: redacted like the chat requests.
            query_veil=redactor.redact if redactor is not None else None,
        )
        where = shown_url(base_url)

        async def reprobe() -> Unavailable | None:
            return await probe(remote, where=where)

        unavailable = await reprobe()
        if not (unavailable and unavailable.why == "no_embeddings" and settings.embeddings == "auto"):
            return _said(KnowledgeBase(sessions=sessions, embedder=remote, unavailable=unavailable, reprobe=reprobe))
        log.warning("%s. Using the local model instead (EMBEDDINGS=auto)", unavailable)
        await remote.close()
    english, multilingual = LocalEmbedder(), MultilingualEmbedder()
    if settings.embeddings_source == "none":
        fix = "Set EMBEDDINGS=local (or openai) for hybrid search"
        off = Unavailable(multilingual.name, "disabled", "EMBEDDINGS=none", fix)
        return _said(KnowledgeBase(sessions=sessions, embedder=multilingual, english=english, unavailable=off))
    if settings.embeddings_source == "local-english":
        return _said(KnowledgeBase(sessions=sessions, embedder=english, unavailable=await english.load()))
    if settings.embeddings_source == "local-multilingual":
        return _said(KnowledgeBase(sessions=sessions, embedder=multilingual, unavailable=await multilingual.load()))
    # Only the English model is loaded now: the multilingual one (70 MB more) at the first collection not all in
    # English, so a knowledge base all in English never loads it; failing then, it is tried again a minute later.
    return _said(
        KnowledgeBase(
            sessions=sessions,
            embedder=multilingual,
            english=english,
            unavailable=await english.load(),
            reprobe=multilingual.load,
        )
    )


def _said(kb: KnowledgeBase) -> KnowledgeBase:
    if kb.unavailable is not None:
        log.warning("knowledge search is full text only. %s", kb.unavailable)
    return kb


async def ensure_knowledge(kb: KnowledgeBase, helpdesk: Helpdesk) -> None:
    """Each collection the declaration names with a folder, ingested from it while it has no documents yet (later
    changes go in with `python -m bot kb ingest`), with shipped vectors where the declaration gives some and they fit
    the embedder. Then, in the background, embed whatever was stored without vectors (while no embedder worked)."""
    stored = {row["collection"]: row["documents"] for row in await kb.stats()}
    missing = [c for c in helpdesk.collections if not stored.get(c.name)]
    if missing:
        await _ingest(kb, missing)
    await _say_foreign(kb, [c for c in helpdesk.collections if c not in missing])
    status = await kb.status()
    for problem in status.problems:
        log.warning("knowledge: %s", problem)
    if status.unembedded:
        kb.start_backfill()


async def _say_foreign(kb: KnowledgeBase, collections: list[Collection]) -> None:
    """A declared collection that holds documents from elsewhere (an earlier declaration's, the sample's, ones added
    with `kb ingest`): its agents answer from them too, so the operator is told how to make it match the folder."""
    if not collections:
        return
    by_collection: dict[str, list[str]] = {}
    for line in await kb.sources():
        name, _, source = line.partition(": ")
        by_collection.setdefault(name, []).append(source)
    for collection in collections:
        files = find_documents([collection.folder])
        # Named from the folder above (as a first start names them) or from the folder itself (as `kb ingest` does).
        here = {str(p.relative_to(collection.folder.parent)) for p in files}
        here |= {str(p.relative_to(collection.folder)) for p in files}
        foreign = [source for source in by_collection.get(collection.name, []) if source not in here]
        if foreign:
            log.warning(
                "knowledge collection %s holds %d document(s) that are not in %s (%s%s); its agents answer from them "
                "too. To read it from the folder alone: python -m bot kb delete --collection %s, and start again",
                collection.name,
                len(foreign),
                collection.folder,
                ", ".join(foreign[:3]),
                ", ..." if len(foreign) > 3 else "",
                collection.name,
            )


async def ensure_sample_knowledge(kb: KnowledgeBase) -> None:
    """The Driftwing sample's knowledge (tests and benchmarks that use the sample)."""
    await ensure_knowledge(kb, build(load(SAMPLE)))


async def _ingest(kb: KnowledgeBase, collections: list[Collection]) -> None:
    empty = [c for c in collections if not find_documents([c.folder])]
    for collection in empty:
        # A folder made for documents still to come: its agents find nothing until some are added.
        log.warning("knowledge collection %s: %s holds no documents to read yet", collection.name, collection.folder)
    collections = [c for c in collections if c not in empty]
    if not collections:
        return
    files = sum(len(find_documents([c.folder])) for c in collections)
    # One check of each vectors file against the model, however many collections share it.
    shipped: dict[Path, Precomputed | None] = {}
    for collection in collections:
        if collection.vectors is not None and collection.vectors not in shipped and kb.unavailable is None:
            # Only the model the file names is asked to check it (the others are not loaded for it).
            loads = (await Precomputed.load(model, collection.vectors) for model in kb.models)
            shipped[collection.vectors] = await anext((p async for p in loads if p is not None), None)
    how = (
        "shipped vectors"
        if any(shipped.values())
        else "embedding them now"
        if kb.unavailable is None
        else "no vectors yet"
    )
    log.info("first start: adding the knowledge (%d documents, %s)", files, how)
    embedder, english = kb.embedder, kb.english
    done = 0
    try:
        for collection in collections:
            vectors = shipped.get(collection.vectors) if collection.vectors is not None else None
            # The shipped vectors stand in for the model that made them, whichever the collection's languages choose.
            kb.embedder = vectors if vectors is not None and vectors.name == embedder.name else embedder
            kb.english = (
                vectors if vectors is not None and english is not None and vectors.name == english.name else english
            )

            def progress(n: int, of: int, source: str, before: int = done) -> None:
                log.info("  knowledge %d/%d: %s", before + n, files, source)

            # Sources are named from the folder above the collection's ("support/warranty.md"), as `kb ingest` does.
            try:
                report = await kb.ingest(
                    [collection.folder],
                    collection=collection.name,
                    root=collection.folder.parent,
                    progress=progress,
                    language=collection.language,
                )
            except IngestFailed as exc:
                raise RefusedToStart(
                    f"knowledge collection {collection.name} could not be added: {exc} (nothing was stored; fix or "
                    "remove the file, or run python -m bot kb ingest to see it)"
                ) from exc
            done += report.added + report.replaced + report.unchanged
            log.info("ingested %s: %d documents, %d chunks", collection.name, report.added, report.chunks)
    finally:
        kb.embedder, kb.english = embedder, english
    misses = sum(p.misses for p in shipped.values() if p is not None)
    if misses:
        log.info("%d passages were not among the shipped vectors and were embedded now", misses)


@dataclass
class Brain:
    """What answers: the roster, grounded on the knowledge base, and the model (or the offline stand-in)."""

    roster: Roster
    model: Model
    knowledge: KnowledgeBase
    offline: bool
    provider: openai.AsyncOpenAI | None = None
    """The LLM provider's client (None offline), for health checks."""
    token_budget: int | None = None
    """History tokens that fit the provider's context window, where it says what that is."""
    router: Router | None = None
    """Routes without a model call when sure (ROUTER_MIN_SCORE); None when off."""
    helpdesk: Helpdesk | None = None
    """The operator's declaration, built: its tool sources run as long as the brain."""

    async def close(self) -> None:
        if self.helpdesk is not None:
            await self.helpdesk.close()
        await self.knowledge.close()
        if self.provider is not None:  # the chat model's client, whatever wraps the model
            await self.provider.close()


async def brain(settings: Settings, db: Database, helpdesk: Helpdesk | None = None) -> Brain:
    """`helpdesk`: the declaration built (`bot.declaration.build.helpdesk`); None: the one the settings point to."""
    if helpdesk is None:
        helpdesk = build(load(find(settings)))
    knowledge = await knowledge_base(settings, db.sessions)
    try:
        await ensure_knowledge(knowledge, helpdesk)
        await helpdesk.start()
    except BaseException:
        await knowledge.close()
        raise
    # Unset: each passage judged by the cut-off of the model that embedded it.
    min_similarity = settings.kb_min_similarity
    roster = helpdesk.roster(knowledge, min_similarity=min_similarity)
    # Descriptions compared with the English model, whatever EMBEDDINGS says: OfflineModel's threshold was
    # calibrated with it (as the Router's was, below), and the multilingual model's similarities run much higher.
    router = SimilarityRouter(
        _english(knowledge) or LocalEmbedder(),
        {name: a.description for name, a in roster.agents.items()},
        knowledge=knowledge,
        collections={name: a.knowledge for name, a in roster.agents.items() if a.knowledge},
        min_passage_similarity=min_similarity,
    )
    offline = OfflineModel(router, texts=settings.texts)
    routes = calibrated_router(settings, roster)
    if not settings.llm_configured:
        return Brain(roster, offline, knowledge, offline=True, router=routes, helpdesk=helpdesk)
    chat = chat_model(settings)
    budget = await fitted_budget(settings)
    return Brain(
        roster,
        FallbackModel(
            tracing.traced_model(provider_model(settings, chat)),
            offline if settings.llm_outage == "offline" else None,
            where=f"the LLM provider ({settings.openai_model} at {shown_url(settings.openai_base_url)})",
        ),
        knowledge,
        offline=False,
        provider=chat.client,
        token_budget=budget,
        router=routes,
        helpdesk=helpdesk,
    )


def calibrated_router(settings: Settings, roster: Roster) -> Router | None:
    """The router with the static table distilled from MiniLM whatever EMBEDDINGS says: its threshold was calibrated
    with it, and it embeds a message by a look-up, so the router never loads MiniLM (nor shares the knowledge base's
    vectors, which a search makes with its own model). Loaded at warm-up, else on the first message."""
    if settings.router_min_score is None:
        return None
    examples = {name: agent.examples for name, agent in roster.agents.items()}
    return Router(StaticEmbedder(), examples, min_score=settings.router_min_score)


def _english(knowledge: KnowledgeBase) -> LocalEmbedder | None:
    """The knowledge base's English local model, if it has one (loaded once for both)."""
    return next((model for model in knowledge.models if isinstance(model, LocalEmbedder)), None)


def terminal_engine(
    settings: Settings, db: Database, brain: Brain, *, on_summary: Callable[[LLMCallRecord], None] | None = None
) -> Conversations:
    """The engine as the terminal commands (chat, eval) run it: no platform to deliver to, no rate limits.
    `on_summary` is told of each call made for a running summary."""
    return Conversations(
        takeover=TAKEOVER,
        sessions=db.sessions,
        roster=brain.roster,
        model=brain.model,
        config=loop_config(settings, token_budget=brain.token_budget),
        summarising=summarising(settings, brain),
        on_summary=on_summary,
        router=brain.router,
    )


async def fitted_budget(settings: Settings) -> int:
    """CONTEXT_TOKEN_BUDGET, lowered to fit the model's context where the provider says how large it is."""
    api_key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    window = await context_window(base_url=settings.openai_base_url, api_key=api_key, model=settings.openai_model)
    budget = history_budget(settings.context_token_budget, window)
    if window is not None and budget < settings.context_token_budget:
        advice = (
            " Raise it on the server: `OLLAMA_CONTEXT_LENGTH=16384 ollama serve`, or `PARAMETER num_ctx 16384` in a "
            "Modelfile (README, Ollama)."
            if window.ollama
            else ""
        )
        log.warning(
            "%s serves a %d-token context (%s): history capped at %d tokens instead of CONTEXT_TOKEN_BUDGET=%d.%s",
            settings.openai_model,
            window.tokens,
            window.source,
            budget,
            settings.context_token_budget,
            advice,
        )
    elif window is not None:
        log.info("%s serves a %d-token context (%s)", settings.openai_model, window.tokens, window.source)
    return budget
