"""the knowledge base's GIN indexes take new entries at once (fastupdate off): no pending list for every search
to read entry by entry

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = ("ix_kb_chunks_tsv", "ix_kb_chunks_identifiers")


def upgrade() -> None:
    # With fastupdate on (Postgres's default), inserted passages wait in a pending list of up to 4 MB until a
    # vacuum merges them, and every index search reads that list whole: the "at least half of the words" step
    # makes up to 64 index searches, 23 ms p50 at 100k passages until autovacuum came by (after 20% more rows).
    # Ingestion is rare and slowed by its embeddings far more than by the index; searches come with every message.
    for index in INDEXES:
        op.execute(f"ALTER INDEX {index} SET (fastupdate = off)")
        # Turning it off does not merge what is already pending.
        op.execute(f"SELECT gin_clean_pending_list('{index}'::regclass)")


def downgrade() -> None:
    for index in INDEXES:
        op.execute(f"ALTER INDEX {index} RESET (fastupdate)")
