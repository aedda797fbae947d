"""Alembic, driven from code: `python -m bot migrate` and the tests both build the schema through here."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config


def _migrations() -> Path:
    # Installed from a wheel, the folder is `agents/db/migrations` (pyproject's package-dir); in a checkout, the
    # repository's top-level `migrations/`.
    here = Path(__file__).resolve().parent
    installed = here / "migrations"
    return installed if installed.is_dir() else here.parent.parent / "migrations"


MIGRATIONS = _migrations()
MIGRATION_LOCK = 7_340_912_004_481_265_024
"""The Postgres advisory lock migrations hold (any bigint no other program of the database uses)."""


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Autogenerate and the schema test skip the per-dimension HNSW indexes: they are expression indexes made
    for whichever embedding dimensions are in use, which the models cannot declare."""
    return not (type_ == "index" and (name or "").startswith("ix_kb_chunks_hnsw_"))


def alembic_config(url: str, *, transaction_pooler: bool = False) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # Passed as an attribute, not as the ini option, because '%' in passwords breaks ini interpolation.
    config.attributes["database_url"] = url
    config.attributes["transaction_pooler"] = transaction_pooler
    return config


def upgrade(url: str, revision: str = "head", *, transaction_pooler: bool = False) -> None:
    """Blocking: call it through `asyncio.to_thread` from async code (env.py runs its own event loop)."""
    command.upgrade(alembic_config(url, transaction_pooler=transaction_pooler), revision)


async def behind(url: str, *, transaction_pooler: bool = False) -> tuple[str | None, str] | None:
    """(the database's revision, this release's) when the database is not at this release's head; None when it is."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection

    from agents.db.engine import make_engine

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None

    def current(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    # A migration may compute between its statements: no bound on a transaction waiting on us.
    engine = make_engine(url, pool_size=1, transaction_pooler=transaction_pooler, idle_in_transaction_s=0)
    try:
        async with engine.connect() as connection:
            revision = await connection.run_sync(current)
    finally:
        await engine.dispose()
    return None if revision == head else (revision, head)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
