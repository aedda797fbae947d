"""Start-up wiring: settings in, a ready database and engine out. Nothing here runs at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.agent import Roster
from agents.knowledge.embedders import Embedder, OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.loop import LoopConfig, Texts
from agents.model import Model, OpenAIChatModel
from agents.offline import FallbackModel, OfflineModel, SimilarityRouter
from agents.roster import KNOWLEDGE_OF, default_roster
from bot.settings import Settings
from db import migrate
from db.embedded import start_embedded
from db.engine import make_engine, make_sessions

log = logging.getLogger(__name__)


@dataclass
class Database:
    url: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    embedded: Any = None
    """The embedded server's handle, kept alive while the process needs it."""


def database_url(settings: Settings) -> tuple[str, Any]:
    """The configured server, or the embedded one (never started when DATABASE_URL is set)."""
    if settings.database_url:
        return settings.database_url, None
    return start_embedded(settings.data_dir)


@asynccontextmanager
async def open_database(settings: Settings, *, run_migrations: bool = True) -> AsyncIterator[Database]:
    url, handle = await asyncio.to_thread(database_url, settings)
    if run_migrations:
        await asyncio.to_thread(migrate.upgrade, url)
    engine = make_engine(url, pool_size=settings.db_pool_size)
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        yield Database(url, engine, make_sessions(engine), handle)
    finally:
        await engine.dispose()


def loop_config(settings: Settings) -> LoopConfig:
    return LoopConfig(
        default_model=settings.openai_model,
        max_llm_calls=settings.max_llm_calls_per_message,
        max_handoffs=settings.max_handoffs_per_message,
        max_parallel_tools=settings.max_parallel_tools,
        token_budget=settings.context_token_budget,
        texts=Texts(escalated=settings.escalation_message, paused=settings.paused_message),
    )


def chat_model(settings: Settings) -> OpenAIChatModel:
    return OpenAIChatModel(
        api_key=settings.openai_api_key.get_secret_value() if settings.openai_api_key else None,
        base_url=settings.openai_base_url,
        timeout_s=settings.openai_timeout_s,
        max_retries=settings.openai_max_retries,
        stream=settings.openai_stream,
    )


def embedder(settings: Settings) -> Embedder:
    use_openai = settings.embeddings == "openai" or (settings.embeddings == "auto" and settings.openai_api_key)
    if use_openai:
        client = openai.AsyncOpenAI(
            api_key=settings.openai_api_key.get_secret_value() if settings.openai_api_key else "not-needed",
            base_url=settings.openai_base_url,
            timeout=settings.openai_timeout_s,
            max_retries=settings.openai_max_retries,
        )
        return OpenAIEmbedder(client=client, model=settings.openai_embedding_model, dim=settings.openai_embedding_dim)
    from agents.knowledge.local import LocalEmbedder  # loads a model: only when it is the one used

    return LocalEmbedder()


SAMPLE_KNOWLEDGE = Path(__file__).resolve().parent.parent / "knowledge" / "sample"


async def ensure_sample_knowledge(kb: KnowledgeBase) -> None:
    """First start on an empty knowledge base: ingest the sample (catalogue and support collections)."""
    if await kb.stats():
        return
    for collection in ("catalogue", "support"):
        report = await kb.ingest([SAMPLE_KNOWLEDGE / collection], collection=collection, root=SAMPLE_KNOWLEDGE)
        log.info("ingested the sample %s: %d documents, %d chunks", collection, report.added, report.chunks)


@dataclass
class Brain:
    """What answers: the roster, grounded on the knowledge base, and the model (or the offline stand-in)."""

    roster: Roster
    model: Model
    knowledge: KnowledgeBase
    offline: bool
    provider: openai.AsyncOpenAI | None = None
    """The LLM provider's client (None offline), for health checks."""

    async def close(self) -> None:
        closer = getattr(self.model, "close", None) or getattr(getattr(self.model, "primary", None), "close", None)
        if closer is not None:
            await closer()


async def brain(settings: Settings, db: Database) -> Brain:
    knowledge = KnowledgeBase(sessions=db.sessions, embedder=embedder(settings))
    await ensure_sample_knowledge(knowledge)
    roster = default_roster(knowledge, min_similarity=settings.kb_min_similarity)
    router = SimilarityRouter(
        knowledge.embedder,
        {name: a.description for name, a in roster.agents.items()},
        knowledge=knowledge,
        collections=KNOWLEDGE_OF,
        min_passage_similarity=settings.kb_min_similarity,
    )
    offline = OfflineModel(router)
    if not settings.llm_configured:
        return Brain(roster, offline, knowledge, offline=True)
    chat = chat_model(settings)
    return Brain(roster, FallbackModel(chat, offline), knowledge, offline=False, provider=chat.client)
