"""Forgetting a person: `forgotten` records that it happened (when, who asked, how many rows) and never whom;
`outbox.erases` names the post an `erase` row takes down (`agents.db.deliveries.Erase`); and indexes on the columns
that name a person, which a forget looks them up by (`agents.personal`).

Revision ID: 0031
Revises: 0030
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_BY_PERSON = (
    ("ix_inbound_identity_user", "inbound", sa.text("(identity ->> 'user')")),
    ("ix_messages_author", "messages", "author"),
    ("ix_outbox_author", "outbox", "author"),
    ("ix_escalations_customer", "escalations", "customer"),
    ("ix_escalations_claimed_by", "escalations", "claimed_by"),
    ("ix_escalations_closed_by", "escalations", "closed_by"),
    ("ix_csat_resolved_by", "csat", "resolved_by"),
    ("ix_answer_feedback_user", "answer_feedback", "user_id"),
    ("ix_admin_actions_user", "admin_actions", "user_id"),
)
"""(index, table, column) the statements that find a person filter on; inbound's author and csat's customer have
theirs already."""


def upgrade() -> None:
    op.create_table(
        "forgotten",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("requested_by", sa.Text, nullable=False),
        sa.Column("counts", JSONB, nullable=False, server_default="{}"),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.add_column("outbox", sa.Column("erases", sa.BigInteger, nullable=True))
    for name, table, column in _BY_PERSON:
        op.create_index(name, table, [column])


def downgrade() -> None:
    for name, table, _ in reversed(_BY_PERSON):
        op.drop_index(name, table)
    op.drop_column("outbox", "erases")
    op.drop_table("forgotten")
