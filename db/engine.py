"""Engine and session factory, made at start-up and disposed at shutdown (never at import)."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from db.url import async_url

Sessions = async_sessionmaker[AsyncSession]


def make_engine(url: str, *, pool_size: int = 20, transaction_pooler: bool = False) -> AsyncEngine:
    """`transaction_pooler`: `url` is PgBouncer (or alike) in transaction mode, where a prepared statement may
    meet another server connection than the one it was prepared on: no statement caches, unique names."""
    pooled: dict[str, object] = {}
    if transaction_pooler:
        pooled = {
            "connect_args": {
                "statement_cache_size": 0,
                "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
            }
        }
        url = async_url(url).update_query_dict({"prepared_statement_cache_size": "0"}).render_as_string(False)
    return create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping: with asyncpg it is three round trips (BEGIN, a ping, ROLLBACK) on every checkout, more
        # than a turn's own statements. A connection the server dropped fails its first statement instead;
        # SQLAlchemy then discards the whole pool, and the caller's retry (a turn run again, Slack's redelivery)
        # gets a fresh one. Recycling bounds how stale an idle connection can get.
        pool_recycle=600,
        # Errors and logs name the statement, never its values: those are customers' messages.
        hide_parameters=True,
        **pooled,
    )


def make_sessions(engine: AsyncEngine) -> Sessions:
    return async_sessionmaker(engine, expire_on_commit=False)
