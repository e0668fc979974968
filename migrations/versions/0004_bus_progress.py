"""bus progress: how far the bus process has processed the reports stream

The liveness check counts a cluster's silence only up to `caught_up_at`, so a frozen, dead
or lagging bus process is not taken for the planes' death (issue 12 item 2).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bus_progress",
        sa.Column("consumer", sa.String(63), primary_key=True),
        sa.Column("alive_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("caught_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stream_last_seq", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("ack_floor", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("pending", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("bus_progress")
