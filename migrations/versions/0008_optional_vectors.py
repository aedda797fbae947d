"""passages without vectors: a knowledge base kept (and searched by full text) while no embedder works

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("kb_collections", "dim", existing_type=sa.Integer(), nullable=True)
    op.alter_column("kb_chunks", "dim", existing_type=sa.Integer(), nullable=True)
    op.alter_column("kb_chunks", "embedding", nullable=True)
    # Backfilling vectors once an embedder works finds the passages that lack them.
    op.create_index("ix_kb_chunks_unembedded", "kb_chunks", ["collection"], postgresql_where=sa.text("dim IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_kb_chunks_unembedded", table_name="kb_chunks")
    op.execute("DELETE FROM kb_chunks WHERE dim IS NULL OR embedding IS NULL")
    op.execute("DELETE FROM kb_collections WHERE dim IS NULL")
    op.alter_column("kb_chunks", "embedding", nullable=False)
    op.alter_column("kb_chunks", "dim", existing_type=sa.Integer(), nullable=False)
    op.alter_column("kb_collections", "dim", existing_type=sa.Integer(), nullable=False)
