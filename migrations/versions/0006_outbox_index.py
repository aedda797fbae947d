"""outbox index by conversation

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_outbox_unsent_by_conversation",
        "outbox",
        ["conversation_id", "id"],
        unique=False,
        postgresql_where="sent_at IS NULL",
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_unsent_by_conversation", table_name="outbox", postgresql_where="sent_at IS NULL")
