"""rate limits: one row of counters per customer and per channel (messages answered this minute, tokens spent
today, and until when the customer has been told of a limit)

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_counters",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("answered", sa.Integer(), server_default="0", nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("told_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("scope", "name"),
    )
    # Every turn updates its customer's row (and its channel's) in place, never an indexed column: room left
    # in each page lets Postgres do that without touching the primary key's index (a HOT update).
    op.execute("ALTER TABLE rate_counters SET (fillfactor = 70)")


def downgrade() -> None:
    op.drop_table("rate_counters")
