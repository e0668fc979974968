"""one spelling per concept: a deployment's autoscaling and placement keys as in the contract

`window_s` → `window_seconds`, `scale_down_delay_s` → `scale_down_delay_seconds`,
`concurrency_target` → `target_concurrency`, `scale_to_zero_idle_s` →
`scale_to_zero_idle_seconds`; `min_providers` → `min_distinct_providers`, `min_regions` →
`min_distinct_regions`. Values are kept, so no deployment changes behaviour. Audit entries
keep the spelling they were written with.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RENAMED = {
    "autoscaling": {
        "window_s": "window_seconds",
        "scale_down_delay_s": "scale_down_delay_seconds",
        "concurrency_target": "target_concurrency",
        "scale_to_zero_idle_s": "scale_to_zero_idle_seconds",
    },
    "placement": {"min_providers": "min_distinct_providers", "min_regions": "min_distinct_regions"},
}


def _rename(column: str, old: str, new: str) -> None:
    # `column` is one of RENAMED's two constants; the keys travel as bound parameters
    statement = sa.text(
        f"UPDATE deployments SET {column} = ({column} - CAST(:old AS text)) "  # noqa: S608
        f"|| jsonb_build_object(CAST(:new AS text), {column} -> CAST(:old AS text)) "
        f"WHERE {column} ? CAST(:old AS text)"
    )
    op.get_bind().execute(statement, {"old": old, "new": new})


def upgrade() -> None:
    for column, keys in RENAMED.items():
        for old, new in keys.items():
            _rename(column, old, new)


def downgrade() -> None:
    for column, keys in RENAMED.items():
        for old, new in keys.items():
            _rename(column, new, old)
