"""the verified author of each inbound message (platform, workspace, user, name, email), and the name each
transcript message was written under

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbound", sa.Column("identity", postgresql.JSONB(), nullable=True))
    op.add_column("messages", sa.Column("author_name", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("messages", "author_name")
    op.drop_column("inbound", "identity")
