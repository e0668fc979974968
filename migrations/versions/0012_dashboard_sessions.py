"""dashboard_sessions: server-side dashboard sign-ins.

The dashboard's cookie carried the API token itself, so logging out revoked nothing (a
copied cookie kept working until the token was disabled). The cookie now carries a random
session id; only its SHA-256 is stored, with the token it speaks for and its expiry.
Logging out deletes the row.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("token_id", sa.String(36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name="fk_dashboard_sessions_token_id_api_tokens",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id_hash", name="pk_dashboard_sessions"),
    )
    op.create_index("ix_dashboard_sessions_token_id", "dashboard_sessions", ["token_id"])
    op.create_index("ix_dashboard_sessions_expires_at", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_expires_at", table_name="dashboard_sessions")
    op.drop_index("ix_dashboard_sessions_token_id", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
