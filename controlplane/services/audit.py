"""Audit entries: who changed what, before and after, in the same transaction as the change.

An entry is one Core INSERT sent at once on the session's connection, not an ORM object
flushed later (nor an ORM execute, which autoflushes first and cost twice the INSERT's CPU):
nothing reads it back in the writing transaction.
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
    session.connection().execute(  # no ORM execute (nor its autoflush): nothing reads it
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
