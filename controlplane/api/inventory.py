"""Generic CRUD routes for every user-managed kind; thin wrappers over services.inventory."""

# No `from __future__ import annotations`: FastAPI reads the spec types at definition time.

from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from controlplane.api.auth import Principal, require
from controlplane.api.context import (
    actor_of,
    if_match,
    if_match_any,
    list_filters,
    read_connection,
    read_scope,
    session_scope,
)
from controlplane.api.jsonbody import JsonRoute
from controlplane.api.schemas import OBJECTS, PAGES
from controlplane.services import inventory as svc
from controlplane.services.resources import KINDS, ResourceKind


def _one(kind: ResourceKind, result: svc.WriteResult, status: int = 200) -> JSONResponse:
    body = svc.to_json(kind, result.row, result.spec)
    body.update(result.secrets or {})
    return JSONResponse(body, status_code=status, headers={"ETag": f'"{result.row.generation}"'})


REPLAN_KINDS = frozenset({"providers", "regions", "pools", "clusters", "deployments"})


def _changed(request: Request, kind: ResourceKind) -> None:
    """After a committed change that placement depends on: ask for a re-plan."""
    if kind.path in REPLAN_KINDS:
        request.app.state.on_inventory_change(kind.kind)


def resource_router(kind: ResourceKind) -> APIRouter:
    router = APIRouter(route_class=JsonRoute, prefix=f"/{kind.path}", tags=[kind.path])
    readers = require(kind.read_role)
    writers = require(kind.write_role)
    spec_type: Any = kind.spec
    one, page = OBJECTS[kind.path], PAGES[kind.path]
    filter_params = [
        {"name": f, "in": "query", "required": False, "schema": {"type": "string"}}
        for f in sorted(kind.filters)
    ]

    @router.get(
        "",
        summary=f"List {kind.path}",
        response_model=page,
        openapi_extra={"parameters": filter_params} if filter_params else None,
    )
    def list_objects(
        request: Request,
        _: Principal = Depends(readers),
        limit: int = Query(100, ge=1, le=500),
        cursor: str | None = None,
    ) -> JSONResponse:
        with read_scope(request) as session:
            rows, next_cursor = svc.list_rows(session, kind, list_filters(request), limit, cursor)
            items = [svc.to_json(kind, r) for r in rows]
        return JSONResponse({"items": items, "next_cursor": next_cursor})

    @router.post("", status_code=201, summary=f"Create a {kind.kind}", response_model=one)
    def create_object(
        request: Request,
        spec: spec_type = Body(),  # pyright: ignore[reportInvalidTypeForm]
        _: Principal = Depends(writers),
    ) -> JSONResponse:
        with session_scope(request) as session:
            response = _one(kind, svc.create(session, kind, spec, actor_of(request)), 201)
        _changed(request, kind)
        return response

    @router.get("/{ref}", summary=f"Get a {kind.kind} by id or name", response_model=one)
    async def get_object(
        request: Request, ref: str, _: Principal = Depends(readers)
    ) -> JSONResponse:
        # async on purpose: a read is one indexed Core query (services.inventory.Rendered
        # renders once per row version), answered in well under a millisecond and never
        # waiting on a row lock (a plain SELECT), so it runs on the event loop; the thread
        # pool's hand-off and the GIL passed back and forth cost more than the query
        # (bench/api.py, 4 workers on 2 shared cores: 0.9 vs 1.1-2.2 ms of API CPU per read).
        # Writes stay in the thread pool: they may wait on a row lock.
        with read_connection(request) as connection:
            body, generation = request.app.state.rendered.get_json(connection, kind, ref)
        return JSONResponse(body, headers={"ETag": f'"{generation}"'})

    @router.put(
        "/{ref}",
        summary=f"Create or replace a {kind.kind} (idempotent)",
        response_model=one,
        responses={201: {"model": one, "description": f"The {kind.kind} was created"}},
    )
    def put_object(
        request: Request,
        ref: str,
        spec: spec_type = Body(),  # pyright: ignore[reportInvalidTypeForm]
        _: Principal = Depends(writers),
    ) -> JSONResponse:
        with session_scope(request) as session:
            result = svc.replace(
                session,
                kind,
                ref,
                spec,
                actor_of(request),
                if_match(request),
                must_exist=if_match_any(request),
            )
            response = _one(kind, result, 201 if result.created else 200)
        if result.changed:
            _changed(request, kind)
        return response

    @router.patch(
        "/{ref}",
        summary=f"Change some fields of a {kind.kind} (JSON merge patch)",
        response_model=one,
    )
    def patch_object(
        request: Request,
        ref: str,
        changes: dict[str, Any] = Body(),
        _: Principal = Depends(writers),
    ) -> JSONResponse:
        with session_scope(request) as session:
            result = svc.patch(session, kind, ref, changes, actor_of(request), if_match(request))
            response = _one(kind, result)
        if result.changed:
            _changed(request, kind)
        return response

    @router.delete("/{ref}", status_code=204, summary=f"Delete a {kind.kind}")
    def delete_object(
        request: Request, ref: str, force: bool = False, _: Principal = Depends(writers)
    ) -> Response:
        with session_scope(request) as session:
            svc.delete(session, kind, ref, actor_of(request), force, if_match(request))
        _changed(request, kind)
        return Response(status_code=204)

    return router


def inventory_routers() -> list[APIRouter]:
    return [resource_router(kind) for kind in KINDS.values()]
