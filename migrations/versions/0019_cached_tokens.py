"""llm_calls.cached_tokens may be NULL: the provider did not say (Ollama, vLLM and many others report no
`prompt_tokens_details`), which is not the same as nothing served from its prompt cache

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("llm_calls", "cached_tokens", existing_type=sa.Integer(), nullable=True, server_default=None)


def downgrade() -> None:
    op.execute("UPDATE llm_calls SET cached_tokens = 0 WHERE cached_tokens IS NULL")
    op.alter_column("llm_calls", "cached_tokens", existing_type=sa.Integer(), nullable=False, server_default="0")
