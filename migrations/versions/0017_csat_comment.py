"""csat.comment: what the customer wrote in the optional comment after rating a resolved case

Revision ID: 0017
Revises: 0016
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("csat", sa.Column("comment", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("csat", "comment")
