"""a deployment's failover settings; the gateways' routing table numbering

`deployments.failover`: the `failover` spec (active_active / active_passive with a standby
cluster, issue 15). `routing_state`: one row with the routing table's `(epoch, generation)`
and the digest of its content, so the generation moves only when the table changes and never
goes back across a restart of the bus process.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deployments",
        sa.Column("failover", postgresql.JSONB(), server_default="{}", nullable=False),
    )
    op.create_table(
        "routing_state",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("digest", sa.String(64), nullable=False, server_default=""),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("routing_state")
    op.drop_column("deployments", "failover")
