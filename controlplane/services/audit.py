"""Audit entries: who changed what, before and after, in the same transaction as the change.

An entry is one Core INSERT sent at once, not an ORM object flushed later: nothing reads it
back in the writing transaction, and the unit of work cost a write more than the INSERT.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, insert
from sqlalchemy.orm import Session

from controlplane.db.models import AuditEntry

ENTRIES = insert(cast(Table, AuditEntry.__table__))


def record(
    session: Session,
    *,
    actor: str,
    action: str,
    kind: str,
    resource_id: str | None,
    name: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    request_id: str | None = None,
) -> None:
    session.execute(
        ENTRIES,
        {
            "actor": actor,
            "action": action,
            "resource_kind": kind,
            "resource_id": resource_id,
            "resource_name": name,
            "before": before,
            "after": after,
            "request_id": request_id,
        },
    )
