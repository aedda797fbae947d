"""Alembic environment, async (asyncpg). The URL comes from agents.db.migrate or, failing that, DATABASE_URL."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from agents.db.engine import make_engine
from agents.db.migrate import MIGRATION_LOCK, include_object
from agents.db.models import Base
from agents.db.url import async_url

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: run migrations through `python -m bot migrate`")
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=target_metadata, compare_type=True, include_object=include_object
    )
    with context.begin_transaction():
        # One migrator at a time: processes started together on a fresh database wait here, then find it at head.
        # A transaction-scoped lock, so that it holds through a pooler in transaction mode and ends with the commit.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


async def _run_async() -> None:
    # Through a pooler in transaction mode (DATABASE_POOLER=transaction) as the bot connects: no statement cache.
    pooler = bool(config.attributes.get("transaction_pooler"))
    # A migration may compute between its statements: no bound on a transaction waiting on us.
    engine = make_engine(_url(), pool_size=1, transaction_pooler=pooler, idle_in_transaction_s=0)
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=str(async_url(_url())), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
