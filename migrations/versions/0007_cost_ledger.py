"""the cost ledger, token usage and public API prices (issue 19, cost half)

`cost_ledger`: GPU-hours held and used and their cost per UTC hour, pool, deployment and
cluster (names, not ids: it outlives what it names); `cost_accrual`: how far it has been
accrued. `token_usage` and `token_counters`: what the planes' routers served, from the
counters in their heartbeats. `api_prices`: a managed kind (ApiPrice).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(63)
TIME = sa.DateTime(timezone=True)


def _now(name: str) -> sa.Column:
    return sa.Column(name, TIME, server_default=sa.text("now()"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "cost_ledger",
        sa.Column("hour", TIME, nullable=False),
        sa.Column("pool", NAME, nullable=False),
        sa.Column("deployment", NAME, nullable=False),
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("provider", NAME, nullable=False),
        sa.Column("region", NAME, nullable=False),
        sa.Column("gpu_type", NAME, nullable=False),
        sa.Column("purchase_type", sa.String(16), nullable=False),
        sa.Column("price_per_gpu_hour", sa.Numeric(14, 6), nullable=False),
        sa.Column("held_gpu_hours", sa.Numeric(20, 9), nullable=False),
        sa.Column("used_gpu_hours", sa.Numeric(20, 9), nullable=False),
        sa.Column("cost", sa.Numeric(20, 9), nullable=False),
        sa.PrimaryKeyConstraint("hour", "pool", "deployment", "cluster", name="pk_cost_ledger"),
    )
    op.create_table(
        "cost_accrual",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("accrued_until", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cost_accrual"),
    )
    op.create_table(
        "token_usage",
        sa.Column("hour", TIME, nullable=False),
        sa.Column("deployment", NAME, nullable=False),
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("response_bytes", sa.BigInteger(), nullable=False),
        sa.Column("cross_region_bytes", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("hour", "deployment", "cluster", name="pk_token_usage"),
    )
    op.create_table(
        "token_counters",
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("deployment", NAME, nullable=False),
        sa.Column("since", sa.String(64), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("response_bytes", sa.BigInteger(), nullable=False),
        sa.Column("cross_region_bytes", sa.BigInteger(), nullable=False, server_default="0"),
        _now("updated_at"),
        sa.PrimaryKeyConstraint("cluster", "deployment", name="pk_token_counters"),
    )
    op.create_table(
        "api_prices",
        sa.Column("model_id", sa.String(255), nullable=False),
        sa.Column("input_price_per_mtok", sa.Numeric(14, 6), nullable=False),
        sa.Column("output_price_per_mtok", sa.Numeric(14, 6), nullable=False),
        sa.Column("source", sa.String(255), nullable=True),
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        _now("created_at"),
        _now("updated_at"),
        sa.Column(
            "status", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_prices"),
        sa.UniqueConstraint("name", name="uq_api_prices_name"),
    )


def downgrade() -> None:
    for table in ("api_prices", "token_counters", "token_usage", "cost_accrual", "cost_ledger"):
        op.drop_table(table)
