"""Retention periods (bot.retention): `conversations.erased_at` marks a transcript erased, so that housekeeping looks
only at conversations with something left to erase; `retention_log` records how many rows each run erased, per
kind (never which); and indexes on the time columns of the rows that still hold text, so each run walks only those.

Revision ID: 0032
Revises: 0031
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_conversations_unerased",
        "conversations",
        ["updated_at"],
        postgresql_where=sa.text("erased_at IS NULL OR erased_at < updated_at"),
    )
    op.create_table(
        "retention_log",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("erased", sa.Integer, nullable=False),
        sa.Column("ran_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_retention_log_ran_at", "retention_log", ["ran_at"])
    op.create_index("ix_inbound_files_held", "inbound", ["received_at"], postgresql_where=sa.text("files IS NOT NULL"))
    op.create_index(
        "ix_tool_runs_text_held",
        "tool_runs",
        ["created_at"],
        postgresql_where=sa.text("arguments <> '' OR output <> ''"),
    )
    op.create_index(
        "ix_llm_calls_error_held", "llm_calls", ["created_at"], postgresql_where=sa.text("error IS NOT NULL")
    )
    op.create_index(
        "ix_outbox_done_held",
        "outbox",
        ["done_at"],
        postgresql_where=sa.text("done_at IS NOT NULL AND (result_ts IS NULL OR text IS NOT NULL)"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_done_held", "outbox")
    op.drop_index("ix_llm_calls_error_held", "llm_calls")
    op.drop_index("ix_tool_runs_text_held", "tool_runs")
    op.drop_index("ix_inbound_files_held", "inbound")
    op.drop_index("ix_retention_log_ran_at", "retention_log")
    op.drop_table("retention_log")
    op.drop_index("ix_conversations_unerased", "conversations")
    op.drop_column("conversations", "erased_at")
