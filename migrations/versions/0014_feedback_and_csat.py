"""feedback and csat: 👍/👎 on the bot's answers (one per answer per person, the last click kept) and the
customers' ratings of resolved cases

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "answer_feedback",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("conversation_id", sa.BigInteger(), nullable=False),
        sa.Column("outbox_id", sa.BigInteger(), nullable=True),
        sa.Column("message_id", sa.BigInteger(), nullable=True),
        sa.Column("agent", sa.Text(), nullable=True),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("message_ts", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("rating", sa.Text(), nullable=False),
        sa.Column("action_ts", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["outbox_id"], ["outbox.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["message_id"], ["messages.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("channel", "message_ts", "user_id"),
    )
    op.create_index("ix_answer_feedback_conversation", "answer_feedback", ["conversation_id"])
    op.create_index("ix_answer_feedback_updated", "answer_feedback", ["updated_at"])
    op.create_table(
        "csat",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("escalation_id", sa.BigInteger(), nullable=False),
        sa.Column("conversation_id", sa.BigInteger(), nullable=False),
        sa.Column("customer", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("rating", sa.Integer(), nullable=True),
        sa.Column("asked_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("rated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["escalation_id"], ["escalations.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("escalation_id"),
        sa.CheckConstraint("rating BETWEEN 1 AND 5", name="ck_csat_rating"),
    )
    op.create_index("ix_csat_customer", "csat", ["customer", "asked_at"])


def downgrade() -> None:
    op.drop_index("ix_csat_customer", table_name="csat")
    op.drop_table("csat")
    op.drop_index("ix_answer_feedback_updated", table_name="answer_feedback")
    op.drop_index("ix_answer_feedback_conversation", table_name="answer_feedback")
    op.drop_table("answer_feedback")
