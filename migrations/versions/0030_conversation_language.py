"""The customer's language per conversation: what the bot's own words and the agents' answers are in.

Revision ID: 0030
Revises: 0029
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and NULL means "not known yet" (the operator's default).
    op.add_column("conversations", sa.Column("language", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("conversations", "language")
