"""Alembic, driven from code: `python -m bot migrate` and the tests both build the schema through here."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config


def _migrations() -> Path:
    # Installed from a wheel, the folder is `db/migrations` (pyproject's package-dir); in a checkout, the
    # repository's top-level `migrations/`.
    here = Path(__file__).resolve().parent
    installed = here / "migrations"
    return installed if installed.is_dir() else here.parent / "migrations"


MIGRATIONS = _migrations()


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


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
