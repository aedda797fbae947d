"""Shared fixtures: a real Postgres (the embedded one, or TEST_DATABASE_URL's server) with a throwaway
database built by the Alembic migrations, the scriptable fake OpenAI server spoken to by the real SDK, the
Slack emulator, and the real bot serving in-process (all from `harness`)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import openai
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.db.engine import make_engine, make_sessions
from agents.knowledge.embedders import OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.model import OpenAIChatModel
from bot.compose import Bot
from bot.playground.slack_emulator import SlackEmulator
from escalation.machine import TAKEOVER
from fakes.openai_server import EMBEDDING_DIM, FakeOpenAI
from fakes.teams_api import TeamsEmulator
from harness import bot as harness
from harness import teams as teams_harness
from harness.database import postgres_server, throwaway_database
from harness.llm import CONFIG, close_models, make_model
from harness.sample import default_roster
from harness.scenarios import serving_as_shipped

TABLES = (
    "conversations, inbound, messages, handoffs, tool_runs, llm_calls, escalations, refunds, received, outbox, "
    "kb_collections, kb_documents, kb_chunks, pauses, admin_actions, send_leases, rate_counters, "
    "teams_service_urls, answer_feedback, csat, previews, retention_log"
)

# --- Lanes: a test is `services` when it needs a database, a server or a process; `make test-fast` runs the rest ---

SERVICE_FIXTURES = frozenset(
    {"server_url", "database_url", "engine", "sessions"}  # Postgres
    | {"fake_server", "fake_llm", "model", "service"}  # the fake LLM
    | {"teams", "emulator", "slack_bot", "shipped_bot", "start_bot"}  # the emulators, the bot
)
"""The fixtures below that start Postgres, an HTTP fake or the bot: a test using one, directly or through another
fixture, is marked `services` here, and so is one using a fixture its module names in a SERVICE_FIXTURES of its own.
A test that starts them itself is marked in its module."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        starting = SERVICE_FIXTURES | getattr(getattr(item, "module", None), "SERVICE_FIXTURES", frozenset())
        if starting.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


class ServiceUsed(RuntimeError):
    """Not an OSError, so that no code's handling of network errors takes it for one."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run without any `services` test (the fast lane) holds its tests to that: opening a connection, listening,
    or starting a process fails the test that does it, a forgotten marker included."""
    if session.items and not any(item.get_closest_marker("services") for item in session.items):
        patch = pytest.MonkeyPatch()
        session.config.add_cleanup(patch.undo)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise ServiceUsed("a test in the fast lane opened a socket or started a process: mark it services")

        for name in ("connect", "connect_ex", "bind"):
            patch.setattr(socket.socket, name, refuse)
        patch.setattr(subprocess.Popen, "__init__", refuse)


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


@pytest.fixture
async def kb(sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI) -> AsyncIterator[KnowledgeBase]:
    """A knowledge base on the fake provider's embeddings."""
    client = openai.AsyncOpenAI(api_key="test", base_url=fake_llm.base_url, max_retries=0)
    yield KnowledgeBase(
        sessions=sessions, embedder=OpenAIEmbedder(client=client, model="fake-embed", dimensions=EMBEDDING_DIM)
    )
    await client.close()


@pytest.fixture
async def model(fake_llm: FakeOpenAI) -> AsyncIterator[OpenAIChatModel]:
    yield make_model(fake_llm)
    await close_models()


@pytest.fixture(autouse=True)
async def _models_closed() -> AsyncIterator[None]:
    """Whatever a test made with `make_model` is closed after it."""
    yield
    await close_models()


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


@pytest.fixture
async def shipped_bot(
    database_url: str, sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> AsyncIterator[Bot]:
    """The bot with an admin, a staff allow-list and CSAT on. `sessions` first: its tables are emptied before the
    bot starts using them (else the two can deadlock)."""
    async with serving_as_shipped(database_url, fake_llm, emulator) as bot:
        yield bot


@pytest.fixture
async def start_bot(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, sessions: async_sessionmaker[AsyncSession]
) -> AsyncIterator[harness.Start]:
    """A factory: each call starts `python -m bot serve` as a real process (on a port of its own) and waits
    until it is ready; the emulator delivers to the last one started. `sessions` first: its tables are emptied
    before a bot uses them."""
    # A killed process's conversations are taken over when its leases run out: soon, in these tests.
    env = harness.bot_env(database_url, fake_llm, emulator, lease_seconds=2)
    async with AsyncExitStack() as started:

        async def start() -> harness.BotProcess:
            return await started.enter_async_context(harness.bot_process(env, emulator))

        yield start
