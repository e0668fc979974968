"""procurement: drain deadline, idle-since and last error per instance; pool/state index

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "instances", sa.Column("drain_deadline", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("instances", sa.Column("idle_since", sa.DateTime(timezone=True), nullable=True))
    op.add_column("instances", sa.Column("error", sa.Text(), nullable=True))
    op.create_index("ix_instances_pool_state", "instances", ["pool_id", "state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_instances_pool_state", table_name="instances")
    op.drop_column("instances", "error")
    op.drop_column("instances", "idle_since")
    op.drop_column("instances", "drain_deadline")
