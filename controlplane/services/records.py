"""What the control plane decided or observed, read-only: placements, replicas, instances,
events, the audit log, and a deployment's revisions.

Pages are ordered by time then id (newest first for events and audit); a cursor names the
last row seen, so a page never repeats or skips a row that was there when it was read.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.orm import Session

from controlplane.db import models as m
from controlplane.errors import BadRequest, Conflict, NotFound
from controlplane.services import inventory
from controlplane.services.resources import KINDS, Filter, eq_filter, ref_filter, time_filter
from controlplane.specs import Role


@dataclass(frozen=True)
class RecordKind:
    path: str
    row: type[Any]
    time_column: str
    role: Role = Role.viewer
    filters: Mapping[str, Filter] = field(default_factory=dict)
    newest_first: bool = False
    names: tuple[str, ...] = ()
    """Columns that name a row besides its id (what the CLI's tables show)."""
    id_prefix: bool = False
    """A unique id prefix of at least ID_PREFIX characters names a row too."""


ID_PREFIX = 8


RECORDS = (
    RecordKind(
        "placements",
        m.Placement,
        "created_at",
        filters={
            "deployment": ref_filter(m.Placement.deployment_id, m.Deployment),
            "cluster": ref_filter(m.Placement.cluster_id, m.Cluster),
            "pool": ref_filter(m.Placement.pool_id, m.Pool),
        },
    ),
    RecordKind(
        "replicas",
        m.Replica,
        "created_at",
        names=("name",),
        filters={
            "deployment": ref_filter(m.Replica.deployment_id, m.Deployment),
            "cluster": ref_filter(m.Replica.cluster_id, m.Cluster),
            "state": eq_filter(m.Replica.state),
        },
    ),
    RecordKind(
        "instances",
        m.Instance,
        "created_at",
        names=("provider_instance_id",),
        id_prefix=True,
        filters={
            "pool": ref_filter(m.Instance.pool_id, m.Pool),
            "cluster": ref_filter(m.Instance.cluster_id, m.Cluster),
            "state": eq_filter(m.Instance.state),
        },
    ),
    RecordKind(
        "events",
        m.Event,
        "time",
        newest_first=True,
        filters={
            "type": eq_filter(m.Event.type),
            "object_kind": eq_filter(m.Event.object_kind),
            "object_name": eq_filter(m.Event.object_name),
            "since": time_filter(m.Event.time, after=True),
            "until": time_filter(m.Event.time, after=False),
        },
    ),
    RecordKind(
        "audit",
        m.AuditEntry,
        "time",
        role=Role.admin,
        newest_first=True,
        filters={
            "actor": eq_filter(m.AuditEntry.actor),
            "action": eq_filter(m.AuditEntry.action),
            "resource_kind": eq_filter(m.AuditEntry.resource_kind),
            "resource_name": eq_filter(m.AuditEntry.resource_name),
            "since": time_filter(m.AuditEntry.time, after=True),
            "until": time_filter(m.AuditEntry.time, after=False),
        },
    ),
)


INTERNAL_COLUMNS = frozenset({"txid"})
"""Bookkeeping no reader needs (the webhook export's cursor): never in an answer."""


def plain(row: Any) -> dict[str, Any]:
    """Every column as JSON: times in ISO 8601, money as a decimal string."""
    out: dict[str, Any] = {}
    for column in row.__table__.columns:
        if column.key in INTERNAL_COLUMNS:
            continue
        value = getattr(row, column.key)
        out[column.key] = value.isoformat() if hasattr(value, "isoformat") else value
        if column.key.endswith("cost_per_hour") and value is not None:
            out[column.key] = str(value)
    return out


def page(
    session: Session, kind: RecordKind, filters: Mapping[str, str], limit: int, cursor: str | None
) -> dict[str, Any]:
    t = getattr(kind.row, kind.time_column)
    order = (t.desc(), kind.row.id.desc()) if kind.newest_first else (t, kind.row.id)
    stmt = select(kind.row).order_by(*order)
    for key, value in filters.items():
        if key not in kind.filters:
            allowed = ", ".join(sorted(kind.filters))
            raise BadRequest(f"unknown filter '{key}' for {kind.path}; allowed filters: {allowed}")
        stmt = kind.filters[key](stmt, value)
    if cursor:
        at, last_id = _decode(cursor)
        after = (t < at) | and_(t == at, kind.row.id < last_id)
        before = (t > at) | and_(t == at, kind.row.id > last_id)
        stmt = stmt.where(or_(after) if kind.newest_first else or_(before))
    rows = list(session.scalars(stmt.limit(limit + 1)))
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1]
        next_cursor = _encode(getattr(last, kind.time_column).isoformat(), last.id)
    return {"items": [plain(r) for r in rows[:limit]], "next_cursor": next_cursor}


def get_one(session: Session, kind: RecordKind, ref: str) -> dict[str, Any]:
    """By id; for replicas also by name, for instances by provider id or a unique id prefix."""
    row = session.get(kind.row, ref)
    if row is None:
        row = _named(session, kind, ref)
    if row is None:
        how = " or ".join(["id", *kind.names, *(["id prefix"] if kind.id_prefix else [])])
        raise NotFound(
            f"no {kind.path} entry with {how} '{ref}'; list them with GET /api/v1/{kind.path}"
        )
    return plain(row)


def _named(session: Session, kind: RecordKind, ref: str) -> Any:
    matches = [getattr(kind.row, column) == ref for column in kind.names]
    if kind.id_prefix and len(ref) >= ID_PREFIX:
        matches.append(kind.row.id.startswith(ref, autoescape=True))
    if not matches:
        return None
    found = list(session.scalars(select(kind.row).where(or_(*matches)).limit(2)))
    if len(found) > 1:
        raise Conflict(
            f"'{ref}' names more than one of {kind.path}; use the id "
            f"(`gpufleet get {kind.path} -o wide` shows it)"
        )
    return found[0] if found else None


def revisions(
    session: Session,
    deployment_ref: str,
    limit: int = 100,
    cursor: str | None = None,
    newest_first: bool = False,
) -> dict[str, Any]:
    """A page of a deployment's revisions, oldest first (``newest_first``: the reverse); the
    cursor names the last revision of the page before."""
    row = inventory.get(session, KINDS["deployments"], deployment_ref)
    rev = m.DeploymentRevision.revision
    stmt = select(m.DeploymentRevision).where(m.DeploymentRevision.deployment_id == row.id)
    if cursor:
        after = _decode_revision(cursor)
        stmt = stmt.where(rev < after if newest_first else rev > after)
    stmt = stmt.order_by(rev.desc() if newest_first else rev)
    revs = list(session.scalars(stmt.limit(limit + 1)))
    next_cursor = None
    if len(revs) > limit:
        next_cursor = base64.urlsafe_b64encode(b"%d" % revs[limit - 1].revision).decode()
    return {"items": [plain(r) for r in revs[:limit]], "next_cursor": next_cursor}


def _decode_revision(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor.encode()).decode()
        if len(text) <= 10 and text.isascii() and text.isdigit():
            return int(text)
    except ValueError:
        pass
    raise BadRequest("cursor is not valid; pass next_cursor from the previous page")


def models_by_cluster(session: Session) -> dict[str, list[str]]:
    """Cluster name → the deployments (the `model` a client sends) placed on it, sorted."""
    rows = session.execute(
        select(m.Cluster.name, m.Deployment.name)
        .join(m.Placement, m.Placement.cluster_id == m.Cluster.id)
        .join(m.Deployment, m.Deployment.id == m.Placement.deployment_id)
        .where(m.Placement.replicas > 0)
        .distinct()
    ).all()
    out: dict[str, list[str]] = {}
    for cluster, deployment in sorted(rows):
        out.setdefault(cluster, []).append(deployment)
    return out


def _encode(at: str, row_id: str) -> str:
    return base64.urlsafe_b64encode(f"{at}|{row_id}".encode()).decode()


def _decode(cursor: str) -> tuple[datetime, str]:
    """The (time, id) a page ended at: a time, not a string (compared as one it was a
    `timestamptz < varchar` that PostgreSQL refuses: every next page was a 500)."""
    try:
        text, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadRequest("cursor is not valid; pass next_cursor from the previous page") from exc
    if len(row_id) > 64 or not row_id.isprintable():
        raise BadRequest("cursor is not valid; pass next_cursor from the previous page")
    return at, row_id


def drop_old_events(session: Session, now: datetime, retention: timedelta) -> int:
    """The events' retention: those recorded before ``now - retention`` go (a plane
    reporting facts, and every heartbeat that changes what a cluster can hold, add rows for
    as long as the fleet runs). Returns how many went."""
    result = session.execute(delete(m.Event).where(m.Event.time < now - retention))
    return int(getattr(result, "rowcount", 0) or 0)
