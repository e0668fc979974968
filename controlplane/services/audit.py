"""Audit entries: who changed what, before and after, in the same transaction as the change."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from controlplane.db.models import AuditEntry


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
    session.add(
        AuditEntry(
            actor=actor,
            action=action,
            resource_kind=kind,
            resource_id=resource_id,
            resource_name=name,
            before=before,
            after=after,
            request_id=request_id,
        )
    )
