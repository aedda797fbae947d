"""human escalation

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("escalations", sa.Column("customer", sa.Text(), nullable=True))
    op.add_column("escalations", sa.Column("case_channel", sa.Text(), nullable=True))
    op.add_column("escalations", sa.Column("case_ts", sa.Text(), nullable=True))
    op.add_column("escalations", sa.Column("claimed_by", sa.Text(), nullable=True))
    op.add_column("escalations", sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("escalations", sa.Column("first_response_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("escalations", sa.Column("closed_by", sa.Text(), nullable=True))
    op.add_column("escalations", sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("escalations", sa.Column("reminders_sent", sa.Integer(), server_default="0", nullable=False))
    op.create_unique_constraint("escalations_case_channel_case_ts_key", "escalations", ["case_channel", "case_ts"])
    op.add_column("inbound", sa.Column("kind", sa.Text(), server_default="customer", nullable=False))
    op.add_column("outbox", sa.Column("escalation_id", sa.BigInteger(), nullable=True))
    op.add_column("outbox", sa.Column("author", sa.Text(), nullable=True))
    op.add_column("outbox", sa.Column("source_ts", sa.Text(), nullable=True))
    op.create_foreign_key(
        "outbox_escalation_id_fkey", "outbox", "escalations", ["escalation_id"], ["id"], ondelete="CASCADE"
    )


def downgrade() -> None:
    op.drop_constraint("outbox_escalation_id_fkey", "outbox", type_="foreignkey")
    op.drop_column("outbox", "source_ts")
    op.drop_column("outbox", "author")
    op.drop_column("outbox", "escalation_id")
    op.drop_column("inbound", "kind")
    op.drop_constraint("escalations_case_channel_case_ts_key", "escalations", type_="unique")
    op.drop_column("escalations", "reminders_sent")
    op.drop_column("escalations", "closed_at")
    op.drop_column("escalations", "closed_by")
    op.drop_column("escalations", "first_response_at")
    op.drop_column("escalations", "claimed_at")
    op.drop_column("escalations", "claimed_by")
    op.drop_column("escalations", "case_ts")
    op.drop_column("escalations", "case_channel")
    op.drop_column("escalations", "customer")
