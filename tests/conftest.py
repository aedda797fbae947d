"""Shared fixtures: a real Postgres (the embedded one, or TEST_DATABASE_URL's server) with a throwaway
database built by the Alembic migrations, and the scriptable fake OpenAI server spoken to by the real SDK."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.loop import LoopConfig
from agents.model import OpenAIChatModel
from agents.roster import default_roster
from db import migrate
from db.embedded import start_embedded
from db.engine import make_engine, make_sessions
from db.url import async_url
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI

TABLES = (
    "conversations, inbound, messages, handoffs, tool_runs, llm_calls, escalations, refunds, slack_events, outbox, "
    "kb_collections, kb_documents, kb_chunks, pauses, admin_actions, send_leases"
)


def _with_database(server_url: str, name: str) -> str:
    return async_url(server_url).set(database=name).render_as_string(hide_password=False)


async def _admin(server_url: str, sql: str) -> None:
    url = async_url(server_url).set(drivername="postgresql")
    conn = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """TEST_DATABASE_URL names a server to use (never the embedded one); otherwise start a private embedded one."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield external
        return
    with tempfile.TemporaryDirectory(prefix="helpdesk-pg-") as tmp:
        url, server = start_embedded(Path(tmp), cleanup="delete")
        yield url
        server.cleanup()


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    name = f"helpdesk_test_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    url = _with_database(server_url, name)
    asyncio.run(_admin(url, "CREATE EXTENSION IF NOT EXISTS vector"))
    migrate.upgrade(url)
    yield url
    asyncio.run(_admin(server_url, f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url, pool_size=30)
    yield engine
    await engine.dispose()


@pytest.fixture
async def sessions(engine: AsyncEngine) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    # Tests run turns in many concurrent transactions, so a wrapping rollback cannot isolate them; emptying the
    # tables before each test does.
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    yield make_sessions(engine)


@pytest.fixture(scope="session")
async def fake_server() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def fake_llm(fake_server: FakeOpenAI) -> FakeOpenAI:
    fake_server.reset()
    return fake_server


def make_model(fake: FakeOpenAI, **kwargs: Any) -> OpenAIChatModel:
    options: dict[str, Any] = {"timeout_s": 5.0, "max_retries": 0} | kwargs
    return OpenAIChatModel(api_key="test-key", base_url=fake.base_url, **options)


@pytest.fixture
async def model(fake_llm: FakeOpenAI) -> AsyncIterator[OpenAIChatModel]:
    model = make_model(fake_llm)
    yield model
    await model.close()


CONFIG = LoopConfig(default_model="fake-model")


@pytest.fixture
def service(sessions: async_sessionmaker[AsyncSession], model: OpenAIChatModel) -> Conversations:
    return Conversations(takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG)


# --- Slack: the emulator plays Slack, the real bot runs in-process on a random port ---------------------

SIGNING_SECRET = "test-signing-secret"


def bot_settings(database_url: str, fake: FakeOpenAI, emulator: Any, **overrides: Any) -> Any:
    from bot.settings import Settings

    values: dict[str, Any] = {
        "database_url": database_url,
        "openai_api_key": "test-key",
        "openai_base_url": fake.base_url,
        "openai_model": "fake-model",
        "openai_max_retries": 0,
        "slack_bot_token": "xoxb-test",
        "slack_signing_secret": SIGNING_SECRET,
        "slack_api_url": emulator.api_url,
        "staff_channel_id": "C_STAFF",
        "max_concurrent_turns": 8,
        "lease_seconds": 3,
        "case_summary": "transcript",
        "embeddings": "openai",
        "embeddings_model": "fake-embed",
    }
    return Settings(_env_file=None, **(values | overrides))  # type: ignore[call-arg]


@pytest.fixture
async def emulator() -> AsyncIterator[Any]:
    from fakes.slack_api import SlackEmulator

    async with SlackEmulator(signing_secret=SIGNING_SECRET, bot_token="xoxb-test") as emu:
        yield emu


@asynccontextmanager
async def serving(settings: Any, emulator: Any) -> AsyncIterator[Any]:
    """The real bot in-process on a random port, with the emulator delivering to it."""
    from aiohttp import web

    from bot.server import running_bot, web_app

    async with running_bot(settings) as bot:
        runner = web.AppRunner(web_app(bot), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        bot.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        emulator.events_url = f"{bot.url}/slack/events"
        try:
            yield bot
        finally:
            await runner.cleanup()


@pytest.fixture
async def slack_bot(
    database_url: str, sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI, emulator: Any
) -> AsyncIterator[Any]:
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator) as bot:
        yield bot
