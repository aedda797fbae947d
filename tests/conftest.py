"""Shared fixtures: a real Postgres (the embedded one, or TEST_DATABASE_URL's server) with a throwaway
database built by the Alembic migrations, the scriptable fake OpenAI server spoken to by the real SDK, the
Slack emulator, and the real bot serving in-process (all from `harness`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.loop import LoopConfig
from agents.model import OpenAIChatModel
from bot.server import Bot
from db.engine import make_engine, make_sessions
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI
from fakes.slack_api import SlackEmulator
from fakes.teams_api import TeamsEmulator
from harness import bot as harness
from harness import teams as teams_harness
from harness.database import postgres_server, throwaway_database
from harness.sample import default_roster

TABLES = (
    "conversations, inbound, messages, handoffs, tool_runs, llm_calls, escalations, refunds, slack_events, outbox, "
    "kb_collections, kb_documents, kb_chunks, pauses, admin_actions, send_leases, rate_counters, "
    "teams_service_urls, answer_feedback, csat"
)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """TEST_DATABASE_URL names a server to use (never the embedded one); otherwise start a private embedded one."""
    with postgres_server("TEST_DATABASE_URL") as (url, _):
        yield url


@pytest.fixture(scope="session")
async def database_url(server_url: str) -> AsyncIterator[str]:
    async with throwaway_database(server_url) as url:
        yield url


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


@pytest.fixture
async def teams(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TeamsEmulator]:
    """The Teams emulator, its credentials in the environment as the SDK reads them."""
    async with teams_harness.emulator() as emulator:
        for name, value in emulator.env().items():
            monkeypatch.setenv(name, value)
        yield emulator


@pytest.fixture
async def emulator() -> AsyncIterator[SlackEmulator]:
    async with harness.emulator() as emu:
        yield emu


@pytest.fixture
async def slack_bot(
    database_url: str, sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> AsyncIterator[Bot]:
    async with harness.serving(harness.bot_settings(database_url, fake_llm, emulator), emulator) as bot:
        yield bot
