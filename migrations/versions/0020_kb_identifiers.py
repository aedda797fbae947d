"""passages keep the identifiers they name (model numbers, part and error codes), for exact matches

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "kb_chunks",
        sa.Column("identifiers", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    )
    # agents.knowledge.identifiers.IN_DOCUMENT and normalise(), in SQL (\y is a word boundary), for the passages
    # stored before this migration; ingestion fills the column from then on.
    op.execute(
        "UPDATE kb_chunks SET identifiers = ARRAY("
        "SELECT DISTINCT replace(m[1], '-', '') FROM regexp_matches("
        "coalesce(title, '') || ' ' || coalesce(heading, '') || ' ' || text, "
        "'\\y([A-Z][A-Z0-9]{0,4}(?:-[A-Z0-9]{1,6})+)\\y', 'g') AS m)"
    )
    op.create_index("ix_kb_chunks_identifiers", "kb_chunks", ["identifiers"], postgresql_using="gin")


def downgrade() -> None:
    op.drop_index("ix_kb_chunks_identifiers", table_name="kb_chunks", postgresql_using="gin")
    op.drop_column("kb_chunks", "identifiers")
