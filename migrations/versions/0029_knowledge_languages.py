"""Knowledge in each document's language: a language per document (declared per collection, or detected), the
passages' full text built in that language's text-search configuration from accent-folded text.

`tsv` stops being a column Postgres generates with the `english` configuration: agents.knowledge writes it at
ingestion (the embedded Postgres has no `unaccent`, so the text is folded in Python before it is stemmed). Documents
stored before keep their English vectors and no language (NULL) until their next ingestion, which redoes them.

Revision ID: 0029
Revises: 0028
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENGLISH_TSV = (
    "setweight(to_tsvector('english', coalesce(title, '') || ' ' || coalesce(heading, '')), 'A') || "
    "setweight(to_tsvector('english', text), 'B')"
)


def upgrade() -> None:
    op.add_column("kb_collections", sa.Column("language", sa.Text(), nullable=True))
    # Every language its documents are in: a question's full-text query is made in each of them. What was stored
    # before was stemmed as English.
    op.add_column(
        "kb_collections",
        sa.Column("languages", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    )
    op.execute("UPDATE kb_collections SET languages = '{en}'")
    op.add_column("kb_documents", sa.Column("language", sa.Text(), nullable=True))
    # Keeps the values (English, as they were): no rewrite of the table, and search works through the upgrade.
    op.execute("ALTER TABLE kb_chunks ALTER COLUMN tsv DROP EXPRESSION")


def downgrade() -> None:
    op.drop_index("ix_kb_chunks_tsv", table_name="kb_chunks")
    op.drop_column("kb_chunks", "tsv")
    op.add_column(
        "kb_chunks",
        sa.Column("tsv", postgresql.TSVECTOR(), sa.Computed(ENGLISH_TSV, persisted=True), nullable=False),
    )
    op.create_index(
        "ix_kb_chunks_tsv", "kb_chunks", ["tsv"], postgresql_using="gin", postgresql_with={"fastupdate": "off"}
    )
    op.drop_column("kb_documents", "language")
    op.drop_column("kb_collections", "languages")
    op.drop_column("kb_collections", "language")
