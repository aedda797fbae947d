"""outbox.sources: the knowledge an agent's answer was grounded in, cited where the channel shows it (issue 28).

Revision ID: 0027
Revises: 0026
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable and without a default: adding it rewrites nothing, and the rows of the release before stay as they are.
    op.add_column("outbox", sa.Column("sources", postgresql.JSONB(astext_type=sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("outbox", "sources")
