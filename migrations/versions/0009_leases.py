"""leases instead of held locks: a turn's conversation lease (owner, expiry, fencing token), the outbox's
per-conversation send lease, and NOTIFY on new work

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("lease_owner", sa.Text(), nullable=True))
    op.add_column("conversations", sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("conversations", sa.Column("lease_token", sa.BigInteger(), server_default="0", nullable=False))
    op.create_table(
        "send_leases",
        sa.Column("conversation_id", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id"),
    )
    # New work reaches every process at once: a message stored (by any process) wakes the turn dispatchers,
    # an outbox row the senders. Listeners are a wake-up only; polling still finds everything.
    op.execute(
        "CREATE FUNCTION helpdesk_notify_work() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM pg_notify(TG_ARGV[0], ''); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER inbound_notify AFTER INSERT ON inbound "
        "FOR EACH STATEMENT EXECUTE FUNCTION helpdesk_notify_work('helpdesk_turns')"
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
        "FOR EACH STATEMENT EXECUTE FUNCTION helpdesk_notify_work('helpdesk_sends')"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
    op.execute("DROP TRIGGER IF EXISTS inbound_notify ON inbound")
    op.execute("DROP FUNCTION IF EXISTS helpdesk_notify_work()")
    op.drop_table("send_leases")
    op.drop_column("conversations", "lease_token")
    op.drop_column("conversations", "lease_until")
    op.drop_column("conversations", "lease_owner")
