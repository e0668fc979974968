"""desired-state epochs per cluster; the time a fact happened on its plane

`clusters.desired_epoch`: the control plane's numbering of a cluster's generations; it starts
a new epoch when it finds a generation it never issued (issue 12 item 10). `events.occurred_at`:
a fact's own time (its envelope's `time`, bounded), beside `time` (when it was received).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "clusters", sa.Column("desired_epoch", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.add_column("events", sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("events", "occurred_at")
    op.drop_column("clusters", "desired_epoch")
