"""slack_events -> received: the table records every channel's deliveries (Slack's events, slash commands and
clicks; Teams' activities), so it is named for what it holds.

A process of the release before keeps writing `slack_events` until it is replaced, and Slack never sends a slash
command or a click again: `slack_events` stays for one release as a view of `received` (Postgres inserts, with ON
CONFLICT, and deletes through a simple view), so the old processes' acknowledgements go on working. The release
after drops it.

Revision ID: 0025
Revises: 0024
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.rename_table("slack_events", "received")
    op.execute("ALTER INDEX slack_events_pkey RENAME TO received_pkey")
    op.execute("CREATE VIEW slack_events AS SELECT * FROM received")


def downgrade() -> None:
    op.execute("DROP VIEW slack_events")
    op.execute("ALTER INDEX received_pkey RENAME TO slack_events_pkey")
    op.rename_table("received", "slack_events")
