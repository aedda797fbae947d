"""give-ups are seen: an outbox row ends sent, skipped or given up (`done_at` and `outcome`, not a `sent_at` that a
given-up row also had); messages set aside after repeated failures are found by an index; a colleague's message
deleted (or edited into a note) before it was relayed is marked, so the relay is skipped

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The partial indexes on "sent_at IS NULL" follow the rename: Postgres keeps them by column, not by name.
    op.alter_column("outbox", "sent_at", new_column_name="done_at")
    op.add_column("outbox", sa.Column("outcome", sa.Text(), nullable=True))
    op.execute(
        "UPDATE outbox SET outcome = CASE WHEN last_error LIKE 'gave up:%' THEN 'given_up' "
        "WHEN last_error LIKE 'skipped:%' THEN 'skipped' ELSE 'sent' END WHERE done_at IS NOT NULL"
    )
    op.create_index("ix_outbox_given_up", "outbox", ["id"], postgresql_where="outcome = 'given_up'")
    op.add_column("inbound", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_inbound_set_aside", "inbound", ["id"], postgresql_where="outcome->>'kind' = 'set_aside'")


def downgrade() -> None:
    op.drop_index("ix_inbound_set_aside", table_name="inbound")
    op.drop_column("inbound", "deleted_at")
    op.drop_index("ix_outbox_given_up", table_name="outbox")
    op.execute("UPDATE outbox SET last_error = 'gave up: ' || coalesce(last_error, '') WHERE outcome = 'given_up'")
    op.drop_column("outbox", "outcome")
    op.alter_column("outbox", "done_at", new_column_name="sent_at")
