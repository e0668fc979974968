"""Read-only routes: what the control plane decided or observed, and the audit log."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from controlplane.api.auth import Principal, require
from controlplane.api.context import list_filters, read_scope
from controlplane.db import models as m
from controlplane.errors import BadRequest, NotFound
from controlplane.services import inventory as svc
from controlplane.services.resources import KINDS, Filter
from controlplane.services.resources import eq_filter as _eq
from controlplane.services.resources import ref_filter as _ref
from controlplane.specs import Role


def _plain(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in row.__table__.columns:
        value = getattr(row, column.key)
        out[column.key] = value.isoformat() if hasattr(value, "isoformat") else value
        if column.key.endswith("cost_per_hour") and value is not None:
            out[column.key] = str(value)
    return out


@dataclass(frozen=True)
class ReadOnlyKind:
    path: str
    row: type[Any]
    time_column: str
    role: Role = Role.viewer
    filters: Mapping[str, Filter] = field(default_factory=dict)
    newest_first: bool = False


READ_ONLY = (
    ReadOnlyKind(
        "placements", m.Placement, "created_at",
        filters={
            "deployment": _ref(m.Placement.deployment_id, m.Deployment),
            "cluster": _ref(m.Placement.cluster_id, m.Cluster),
            "pool": _ref(m.Placement.pool_id, m.Pool),
        },
    ),
    ReadOnlyKind(
        "replicas", m.Replica, "created_at",
        filters={
            "deployment": _ref(m.Replica.deployment_id, m.Deployment),
            "cluster": _ref(m.Replica.cluster_id, m.Cluster),
            "state": _eq(m.Replica.state),
        },
    ),
    ReadOnlyKind(
        "instances", m.Instance, "created_at",
        filters={
            "pool": _ref(m.Instance.pool_id, m.Pool),
            "cluster": _ref(m.Instance.cluster_id, m.Cluster),
            "state": _eq(m.Instance.state),
        },
    ),
    ReadOnlyKind(
        "events", m.Event, "time", newest_first=True,
        filters={
            "type": _eq(m.Event.type),
            "object_kind": _eq(m.Event.object_kind),
            "object_name": _eq(m.Event.object_name),
        },
    ),
    ReadOnlyKind(
        "audit", m.AuditEntry, "time", role=Role.admin, newest_first=True,
        filters={
            "actor": _eq(m.AuditEntry.actor),
            "action": _eq(m.AuditEntry.action),
            "resource_kind": _eq(m.AuditEntry.resource_kind),
            "resource_name": _eq(m.AuditEntry.resource_name),
        },
    ),
)  # fmt: skip


def _page(
    session: Session, kind: ReadOnlyKind, filters: Mapping[str, str], limit: int, cursor: str | None
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
    return {"items": [_plain(r) for r in rows[:limit]], "next_cursor": next_cursor}


def _encode(at: str, row_id: str) -> str:
    return base64.urlsafe_b64encode(f"{at}|{row_id}".encode()).decode()


def _decode(cursor: str) -> tuple[str, str]:
    try:
        at, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
    except ValueError as exc:
        raise BadRequest("cursor is not valid; pass next_cursor from the previous page") from exc
    return at, row_id


def _router(kind: ReadOnlyKind) -> APIRouter:
    router = APIRouter(prefix=f"/{kind.path}", tags=[kind.path])
    readers = require(kind.role)
    params = [
        {"name": f, "in": "query", "required": False, "schema": {"type": "string"}}
        for f in sorted(kind.filters)
    ]

    @router.get("", summary=f"List {kind.path}", openapi_extra={"parameters": params})
    def list_objects(
        request: Request,
        _: Principal = Depends(readers),
        limit: int = Query(100, ge=1, le=500),
        cursor: str | None = None,
    ) -> dict[str, Any]:
        with read_scope(request) as session:
            return _page(session, kind, list_filters(request), limit, cursor)

    @router.get("/{object_id}", summary=f"Get one of {kind.path} by id")
    def get_object(
        request: Request, object_id: str, _: Principal = Depends(readers)
    ) -> dict[str, Any]:
        with read_scope(request) as session:
            row = session.get(kind.row, object_id)
            if row is None:
                raise NotFound(f"no {kind.path} entry with id '{object_id}'")
            return _plain(row)

    return router


def revisions_router() -> APIRouter:
    router = APIRouter(tags=["deployments"])
    kind = KINDS["deployments"]

    @router.get("/deployments/{ref}/revisions", summary="List a deployment's revisions")
    def list_revisions(
        request: Request, ref: str, _: Principal = Depends(require(Role.viewer))
    ) -> dict[str, Any]:
        with read_scope(request) as session:
            row = svc.get(session, kind, ref)
            revs = sorted(row.revisions, key=lambda r: r.revision)
            return {"items": [_plain(r) for r in revs], "next_cursor": None}

    return router


def observed_routers() -> list[APIRouter]:
    return [_router(k) for k in READ_ONLY] + [revisions_router()]
