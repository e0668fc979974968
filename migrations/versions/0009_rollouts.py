"""canary rollouts: a deployment's rollout spec, the rollout record, the routers' outcomes

`deployments.rollout`: the `rollout` spec (strategy, steps, hold, gates; issue 18).
`rollouts`: one row per canary (from/to revision, phase, step, the window the gates judge).
`router_outcomes`: the last outcome counters each cluster's router reported per entry.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deployments",
        sa.Column("rollout", postgresql.JSONB(), server_default="{}", nullable=False),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column(
            "deployment_id",
            sa.String(36),
            sa.ForeignKey(
                "deployments.id",
                ondelete="CASCADE",
                name="fk_rollouts_deployment_id_deployments",
            ),
            nullable=False,
        ),
        sa.Column("from_revision", sa.Integer(), nullable=False),
        sa.Column("to_revision", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(16), nullable=False),
        sa.Column("policy", postgresql.JSONB(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("paused_from", sa.String(16), nullable=True),
        sa.Column("window_start", postgresql.JSONB(), nullable=False),
        sa.Column("last_windows", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_rollouts"),
    )
    op.create_index("ix_rollouts_deployment_created", "rollouts", ["deployment_id", "created_at"])
    op.create_table(
        "router_outcomes",
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("entry", sa.String(128), nullable=False),
        sa.Column("counters", postgresql.JSONB(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("cluster", "entry", name="pk_router_outcomes"),
    )


def downgrade() -> None:
    op.drop_table("router_outcomes")
    op.drop_index("ix_rollouts_deployment_created", table_name="rollouts")
    op.drop_table("rollouts")
    op.drop_column("deployments", "rollout")
