"""The schema exists only through Alembic; the URL forms hosting platforms hand out are accepted."""

from __future__ import annotations

import asyncio

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import create_async_engine

from agents.db import migrate
from agents.db.models import Base
from agents.db.url import async_url
from harness.database import throwaway_database


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("postgres://u:p@h:5432/d", "postgresql+asyncpg://u:p@h:5432/d"),
        ("postgresql://u:p@h/d", "postgresql+asyncpg://u:p@h/d"),
        ("postgresql+asyncpg://u:p@h/d", "postgresql+asyncpg://u:p@h/d"),
        ("postgresql+psycopg://u:p@h/d", "postgresql+asyncpg://u:p@h/d"),
        ("postgres://u:p@h/d?sslmode=require", "postgresql+asyncpg://u:p@h/d?ssl=require"),
        ("postgresql://postgres:@/postgres?host=/tmp/x", "postgresql+asyncpg://postgres:@/postgres?host=%2Ftmp%2Fx"),
    ],
)
def test_database_url_forms(raw: str, expected: str) -> None:
    assert async_url(raw).render_as_string(hide_password=False) == expected


def test_non_postgres_url_is_refused() -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        async_url("mysql://u:p@h/d")


def _diff(connection: Connection) -> list[object]:
    return list(
        compare_metadata(
            MigrationContext.configure(
                connection, opts={"compare_type": True, "include_object": migrate.include_object}
            ),
            Base.metadata,
        )
    )


async def test_migrations_match_models_and_downgrade_cleanly(server_url: str) -> None:
    async with throwaway_database(server_url, "helpdesk_migrations") as url:  # upgraded to head
        engine = create_async_engine(async_url(url))
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
        await asyncio.to_thread(migrate.downgrade, url, "base")
        async with engine.connect() as conn:
            tables = await conn.scalar(
                text(
                    "SELECT count(*) FROM information_schema.tables"
                    " WHERE table_schema='public' AND table_name <> 'alembic_version'"
                )
            )
        assert tables == 0
        await asyncio.to_thread(migrate.upgrade, url)
        await engine.dispose()


async def test_the_release_before_still_records_deliveries_during_a_deploy(server_url: str) -> None:
    """Migration 0025 renamed `slack_events` to `received`: a process of the release before, still running while the
    new one starts, records its deliveries as it always did, and they count for the new one too."""
    async with throwaway_database(server_url, "helpdesk_rename") as url:
        engine = create_async_engine(async_url(url))
        old = (
            "INSERT INTO slack_events (event_id, team_id, event_type, disposition)"
            " VALUES (:id, 'T1', 'message', 'received') ON CONFLICT DO NOTHING RETURNING event_id"
        )
        async with engine.begin() as conn:
            assert await conn.scalar(text(old), {"id": "Ev1"}) == "Ev1"
            assert await conn.scalar(text(old), {"id": "Ev1"}) is None  # a retry is recognised
            assert await conn.scalar(text("SELECT count(*) FROM received WHERE event_id = 'Ev1'")) == 1
            await conn.execute(text("DELETE FROM slack_events WHERE event_id = 'Ev1'"))  # its pruning
            assert await conn.scalar(text("SELECT count(*) FROM received")) == 0
        await engine.dispose()
