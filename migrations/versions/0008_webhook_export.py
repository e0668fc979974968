"""the webhook export of events and audit entries

`events.txid`, `audit_entries.txid`: the writing transaction's id (`pg_current_xact_id()`),
the export's cursor; rows written before this revision have none and are not exported.
`webhook_cursors`: one row per stream with how far the export has come and its counts.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CURRENT_TXID = sa.text("(pg_current_xact_id()::text)::bigint")


def upgrade() -> None:
    for table in ("events", "audit_entries"):
        op.add_column(table, sa.Column("txid", sa.BigInteger(), nullable=True))
        op.alter_column(table, "txid", server_default=CURRENT_TXID)  # new rows only
        op.create_index(f"ix_{table}_txid", table, ["txid"])
    op.create_table(
        "webhook_cursors",
        sa.Column("stream", sa.String(16), primary_key=True),
        sa.Column("txid", sa.BigInteger(), nullable=False),
        sa.Column("row_id", sa.String(36), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered", sa.BigInteger(), nullable=False),
        sa.Column("failed_attempts", sa.BigInteger(), nullable=False),
        sa.Column("dead_letters", sa.BigInteger(), nullable=False),
        sa.Column("last_error", sa.String(255), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("webhook_cursors")
    for table in ("audit_entries", "events"):
        op.drop_index(f"ix_{table}_txid", table_name=table)
        op.drop_column(table, "txid")
