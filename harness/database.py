"""Postgres for tests and benchmarks: a server, a throwaway database built by the migrations, and waiting
until the bot has processed every stored message and sent every queued Slack call, and what the tables hold."""

from __future__ import annotations

import asyncio
import collections
import os
import tempfile
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import NullPool

from agents.db import migrate
from agents.db import models as m
from agents.db.embedded import start_embedded
from agents.db.url import async_url

Sessions = async_sessionmaker[AsyncSession]


@contextmanager
def postgres_server(variable: str) -> Iterator[tuple[str, str]]:
    """(server URL, where it came from): the server the environment variable names (never an embedded one),
    or a private embedded Postgres in a temporary folder, deleted on exit."""
    external = os.environ.get(variable)
    if external:
        yield external, variable
        return
    with tempfile.TemporaryDirectory(prefix="helpdesk-pg-") as tmp:
        url, server = start_embedded(Path(tmp), cleanup="delete")
        try:
            yield url, "embedded Postgres"
        finally:
            server.cleanup()


async def admin(url: str, sql: str) -> str | None:
    """Run one statement outside any transaction (CREATE/DROP DATABASE); its first value as text, if any."""
    engine = create_async_engine(async_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(text(sql))
            value = result.scalar() if result.returns_rows else None
            return None if value is None else str(value)
    finally:
        await engine.dispose()


@asynccontextmanager
async def throwaway_database(server_url: str, prefix: str = "helpdesk_test") -> AsyncIterator[str]:
    """A fresh database on the server, built by the Alembic migrations; its URL. Dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    await admin(server_url, f'CREATE DATABASE "{name}"')
    url = async_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        await admin(url, "CREATE EXTENSION IF NOT EXISTS vector")
        await asyncio.to_thread(migrate.upgrade, url)
        yield url
    finally:
        await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def count(sessions: Sessions, model: Any, *where: Any) -> int:
    async with sessions() as s:
        return int(await s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


async def settle(sessions: Sessions, timeout_s: float = 10.0) -> None:
    """Wait until every stored message is processed and every queued Slack call sent."""
    for _ in range(round(timeout_s / 0.05)):
        if not await count(sessions, m.Inbound, m.Inbound.processed_at.is_(None)) and not await count(
            sessions, m.Outbox, m.Outbox.done_at.is_(None)
        ):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("work left unfinished")


async def case_known(sessions: Sessions, case_ts: str, timeout_s: float = 10.0) -> None:
    """Wait until the bot has recorded the case message `case_ts` (the platform shows a post before the bot has
    its answer): a colleague's reply in its thread before then is, rightly, not a case thread's."""
    for _ in range(round(timeout_s / 0.05)):
        if await count(sessions, m.Escalation, m.Escalation.case_ts == case_ts):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"case message {case_ts} never recorded")


async def held(sessions: Sessions, needles: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(table, column, needle) for each text or JSON column of any table that holds one of `needles`."""
    found = []
    async with sessions() as s:
        columns = await s.execute(
            text(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() "
                "AND data_type IN ('text', 'character varying', 'json', 'jsonb', 'ARRAY', 'tsvector')"
            )
        )
        for table, column, _ in columns.all():
            for needle in needles:
                hit = await s.scalar(
                    text(f'SELECT count(*) FROM "{table}" WHERE strpos("{column}"::text, :n) > 0'), {"n": needle}
                )
                if hit:
                    found.append((table, column, needle))
    return found


class DriverLog:
    """The statements the driver runs on `engine`'s connections, in order (asyncpg's query loggers, added to each
    connection as the pool lends it): the hot path's, run on the driver's own connection by
    `agents.db.statements.alone`, and every transaction's BEGIN, COMMIT and ROLLBACK. SQLAlchemy's own statements
    run as prepared statements, which the driver does not log; its `before_cursor_execute` event sees those. The
    driver tells its loggers on the event loop's next turn: `await log.settled()` before reading."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.statements: list[str] = []
        self.kinds: collections.Counter[str] = collections.Counter()
        """Statements by first word (SELECT, WITH, BEGIN, COMMIT...), counted as they come."""
        self._drivers: weakref.WeakSet[Any] = weakref.WeakSet()

    def _lent(self, dbapi_connection: Any, *_: Any) -> None:
        driver = dbapi_connection.driver_connection
        driver.add_query_logger(self._logged)
        self._drivers.add(driver)

    def _logged(self, record: Any) -> None:
        sql = str(record.query).strip().rstrip(";")
        if "typeinfo_tree" not in sql and "set_config('jit'" not in sql:  # the driver's own, once per new type
            self.statements.append(sql)
            self.kinds[_first_word(sql)] += 1

    def __enter__(self) -> DriverLog:
        event.listen(self.engine.sync_engine, "checkout", self._lent)
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(self.engine.sync_engine, "checkout", self._lent)
        for driver in list(self._drivers):
            driver.remove_query_logger(self._logged)

    async def settled(self) -> list[str]:
        await asyncio.sleep(0)
        return self.statements

    @staticmethod
    def first_words(statements: list[str]) -> list[str]:
        return [_first_word(statement) for statement in statements]


def _first_word(sql: str) -> str:
    return sql.split(None, 1)[0].upper()
