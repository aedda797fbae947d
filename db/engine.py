"""Engine and session factory, made at start-up and disposed at shutdown (never at import)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from db.url import async_url

Sessions = async_sessionmaker[AsyncSession]


def make_engine(url: str, *, pool_size: int = 20) -> AsyncEngine:
    return create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
    )


def make_sessions(engine: AsyncEngine) -> Sessions:
    return async_sessionmaker(engine, expire_on_commit=False)
