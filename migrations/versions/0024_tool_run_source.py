"""tool_runs.source: where each tool call ran (python, http, mcp:<server>), for the audit trail of operators' tools

Revision ID: 0024
Revises: 0023
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: Postgres adds the column without rewriting the table.
    op.add_column("tool_runs", sa.Column("source", sa.Text(), nullable=False, server_default="python"))
    # /support tools reads the last day's calls by time.
    op.create_index("ix_tool_runs_created_at", "tool_runs", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_tool_runs_created_at", table_name="tool_runs")
    op.drop_column("tool_runs", "source")
