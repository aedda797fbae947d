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
