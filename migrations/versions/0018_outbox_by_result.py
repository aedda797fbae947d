"""outbox rows by the message they posted (channel, result_ts): a click on a posted answer (feedback) finds its row
without reading the whole outbox

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_outbox_posted", "outbox", ["channel", "result_ts"], postgresql_where="result_ts IS NOT NULL")


def downgrade() -> None:
    op.drop_index("ix_outbox_posted", table_name="outbox")
