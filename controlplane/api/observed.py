"""Read-only routes: what the control plane decided or observed, and the audit log."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from controlplane.api.auth import Principal, require
from controlplane.api.context import list_filters, read_scope
from controlplane.api.jsonbody import JsonRoute
from controlplane.api.schemas import RECORD_PAGES, RECORDS_OUT, RevisionPage
from controlplane.services import records
from controlplane.services.records import RECORDS, RecordKind
from controlplane.specs import Role


def _router(kind: RecordKind) -> APIRouter:
    router = APIRouter(route_class=JsonRoute, prefix=f"/{kind.path}", tags=[kind.path])
    readers = require(kind.role)
    params = [
        {"name": f, "in": "query", "required": False, "schema": {"type": "string"}}
        for f in sorted(kind.filters)
    ]

    @router.get(
        "",
        summary=f"List {kind.path}",
        response_model=RECORD_PAGES[kind.path],
        openapi_extra={"parameters": params},
    )
    def list_objects(
        request: Request,
        _: Principal = Depends(readers),
        limit: int = Query(100, ge=1, le=500),
        cursor: str | None = None,
    ) -> JSONResponse:
        with read_scope(request) as session:
            return JSONResponse(records.page(session, kind, list_filters(request), limit, cursor))

    by = " or ".join(["id", *kind.names, *(["a unique id prefix"] if kind.id_prefix else [])])

    @router.get(
        "/{ref}",
        summary=f"Get one of {kind.path} by {by}",
        response_model=RECORDS_OUT[kind.path],
    )
    def get_object(request: Request, ref: str, _: Principal = Depends(readers)) -> JSONResponse:
        with read_scope(request) as session:
            return JSONResponse(records.get_one(session, kind, ref))

    return router


def revisions_router() -> APIRouter:
    router = APIRouter(route_class=JsonRoute, tags=["deployments"])

    @router.get(
        "/deployments/{ref}/revisions",
        summary="List a deployment's revisions",
        response_model=RevisionPage,
    )
    def list_revisions(
        request: Request,
        ref: str,
        limit: int = Query(100, ge=1, le=500),
        cursor: str | None = Query(None, max_length=64),
        _: Principal = Depends(require(Role.viewer)),
    ) -> JSONResponse:
        with read_scope(request) as session:
            return JSONResponse(records.revisions(session, ref, limit, cursor))

    return router


def observed_routers() -> list[APIRouter]:
    return [_router(k) for k in RECORDS] + [revisions_router()]
