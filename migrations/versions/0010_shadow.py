"""shadow traffic: a deployment's shadow revision (issue 18, docs/rollouts.md#shadow-traffic)

`deployments.shadow`: the `shadow` spec (share, replicas, the revision fields it changes);
NULL: no shadow. `deployments.shadow_window`: the routers' outcome counters of the deployment
and its shadow lane when the shadow was last set or changed (cluster → entry → counters):
where the shadow report's window starts.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("deployments", sa.Column("shadow", postgresql.JSONB(), nullable=True))
    op.add_column("deployments", sa.Column("shadow_window", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("deployments", "shadow_window")
    op.drop_column("deployments", "shadow")
