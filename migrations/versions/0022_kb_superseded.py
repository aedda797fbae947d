"""documents that say they are superseded are flagged (ranked below current ones); identifiers include codes
with underscores and version numbers

Revision ID: 0022
Revises: 0021
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PASSAGE = "coalesce(title, '') || ' ' || coalesce(heading, '') || ' ' || text"


def upgrade() -> None:
    # The flag is read from the file, which the database does not keep: a superseded document stored before this is
    # flagged at its next ingestion (KnowledgeBase._ingest_one compares the flag as well as the content hash).
    op.add_column(
        "kb_documents", sa.Column("superseded", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    # agents.knowledge.identifiers.IN_DOCUMENT and normalise(), in SQL (\y is a word boundary, \: a colon and
    # not a bind parameter), for the passages stored before this migration; ingestion fills the column from then on.
    op.execute(
        "UPDATE kb_chunks SET identifiers = ARRAY("
        f"SELECT m[1] FROM regexp_matches({PASSAGE}, '\\y[vV]?(\\d{{1,4}}(?:\\.\\d{{1,4}}){{2,3}})\\y', 'g') AS m "
        "UNION SELECT replace(replace(m[1], '-', ''), '_', '') FROM regexp_matches("
        f"{PASSAGE}, '\\y([A-Z][A-Z0-9]{{0,4}}(?:-[A-Z0-9]{{1,6}})+|[A-Z][A-Z0-9]*(?\\:_[A-Z0-9]+)+)\\y', 'g') AS m)"
    )


def downgrade() -> None:
    op.drop_column("kb_documents", "superseded")
