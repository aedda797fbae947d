"""previews.shown_at: when the stream last showed something, so that a stream's final message waits out the
platform's pace (Teams: one activity a second) exactly, rather than being refused and waiting a whole second.

Revision ID: 0028
Revises: 0027
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("previews", sa.Column("shown_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("previews", "shown_at")
