"""conversations keep a running summary of their older turns, and the last message it covers (agents.summary)

Revision ID: 0021
Revises: 0020
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("summary", sa.Text(), nullable=True))
    op.add_column("conversations", sa.Column("summary_through", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("conversations", "summary_through")
    op.drop_column("conversations", "summary")
