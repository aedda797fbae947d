"""teams: where each Teams conversation's Bot Connector service lives (the activity's serviceUrl, vouched for by
the token's `serviceurl` claim), so that replies, cases and relays sent later, by any process, go there; and
inbound rows by author, where a Teams person's name is looked up for the staff side's messages

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "teams_service_urls",
        sa.Column("conversation", sa.Text(), nullable=False),
        sa.Column("service_url", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("conversation"),
    )
    op.create_index("ix_inbound_author", "inbound", ["author", "id"])


def downgrade() -> None:
    op.drop_index("ix_inbound_author", table_name="inbound")
    op.drop_table("teams_service_urls")
