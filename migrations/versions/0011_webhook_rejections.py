"""webhook_cursors.rejections: refusals of the batch at the cursor in a row.

The batch is dead-lettered after `events_webhook_max_rejections` refusals in a row; any
other failure (a timeout, a 5xx, 408/429) resets the count. `attempts` (failures in a row,
for the backoff) counted both, so four 503s and one 401 dead-lettered a batch.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "webhook_cursors",
        sa.Column("rejections", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("webhook_cursors", "rejections")
