"""Rollout routes: a deployment's current (or last) rollout, and the operators' commands."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from controlplane.api.auth import Principal, require
from controlplane.api.context import actor_of, read_scope, session_scope
from controlplane.api.jsonbody import JsonRoute
from controlplane.api.schemas import RolloutOut
from controlplane.services import rollouts as svc
from controlplane.services.resources import KINDS

Command = Literal["pause", "resume", "promote", "rollback"]


def rollouts_router() -> APIRouter:
    router = APIRouter(route_class=JsonRoute, tags=["deployments"])
    writers = require(KINDS["deployments"].write_role)

    @router.get(
        "/deployments/{ref}/rollout",
        summary="A deployment's current rollout, or its last one",
        response_model=RolloutOut,
    )
    def get_rollout(
        request: Request, ref: str, _: Principal = Depends(require(KINDS["deployments"].read_role))
    ) -> JSONResponse:
        with read_scope(request) as session:
            return JSONResponse(svc.get(session, ref))

    @router.post(
        "/deployments/{ref}/rollout/{command}",
        summary="Pause, resume, promote or roll back a deployment's running rollout",
        response_model=RolloutOut,
    )
    def command_rollout(
        request: Request, ref: str, command: Command, _: Principal = Depends(writers)
    ) -> JSONResponse:
        actor = actor_of(request)
        with session_scope(request) as session:
            body = svc.command(
                session, ref, command, datetime.now(UTC), actor.name, actor.request_id
            )
        if command == "rollback":  # the stable revision's spec is back: placement may differ
            request.app.state.on_inventory_change("Deployment")
        return JSONResponse(body)

    return router
