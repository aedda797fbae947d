"""Statements built once, for the hot path: a statement's SQL is rendered for the driver when its module is imported
(`:name` placeholders become asyncpg's `$n`), and each call hands the driver that string and the values in order. No
clause is built, no cache key generated, nothing compiled and no ORM session made per call; asyncpg prepares the
string once per connection (its statement cache).

A statement that is a transaction by itself runs on a connection of `alone(engine)`: in autocommit, so Postgres commits
it without the BEGIN and COMMIT round trips around it (and SQLAlchemy's transaction around it), and a read leaves no
transaction to roll back. Statements that must commit together run in one (`engine.begin()`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy import CursorResult, text
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

TRANSACTION_POOLER = "helpdesk_transaction_pooler"
"""An engine's execution option, set by `agents.db.engine.make_engine` when its URL is a pooler in transaction mode."""

_DRIVER = PGDialect_asyncpg()  # type: ignore[no-untyped-call]


class Statement:
    """One statement's SQL as the driver takes it, and the order of its values."""

    def __init__(self, sql: str) -> None:
        compiled = text(sql).compile(dialect=_DRIVER)
        self.sql = compiled.string
        self.names = tuple(compiled.positiontup or ())

    async def run(self, conn: AsyncConnection, values: Mapping[str, Any]) -> CursorResult[Any]:
        return await conn.exec_driver_sql(self.sql, tuple(values[name] for name in self.names))


def engine_of(sessions: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    """The engine `sessions` are made on (`agents.db.engine.make_sessions`)."""
    engine = sessions.kw["bind"]
    assert isinstance(engine, AsyncEngine)
    return engine


def alone(engine: AsyncEngine) -> Callable[[], AbstractAsyncContextManager[AsyncConnection]]:
    """A connection of `engine` for statements that are a transaction each (`async with alone(engine)() as conn`).
    Behind a pooler in transaction mode a statement is prepared and run in two round trips, which only a
    transaction keeps on one server connection: there they keep their BEGIN and COMMIT."""
    if engine.get_execution_options().get(TRANSACTION_POOLER):
        return engine.begin
    return engine.execution_options(isolation_level="AUTOCOMMIT").connect
