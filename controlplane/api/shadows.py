"""Shadow routes: a deployment's shadow report, live vs shadow side by side
(docs/rollouts.md#shadow-traffic)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from controlplane.api.auth import Principal, require
from controlplane.api.context import read_scope
from controlplane.api.jsonbody import JsonRoute
from controlplane.api.schemas import Out
from controlplane.services import shadows as svc
from controlplane.services.resources import KINDS


class ShadowSideOut(Out):
    requests: int = Field(description="answers counted over the window")
    errors: int = Field(description="5xx answers and engine errors mid-stream")
    error_rate: float
    p50_ttft_s: float = Field(description="upper bound of the latency bucket it falls in")
    p99_ttft_s: float
    p50_e2e_s: float
    p99_e2e_s: float
    dropped: int = Field(description="copies the routers dropped (shadow only): never sent")


class ShadowReportOut(Out):
    deployment: str
    lane: str = Field(description="the desired-state entry that runs the shadow revision")
    spec: dict[str, object] = Field(description="the deployment's shadow setting")
    clusters: list[str] = Field(description="clusters whose routers reported the shadow lane")
    live: ShadowSideOut = Field(description="the deployment's own answers (users')")
    shadow: ShadowSideOut = Field(description="the shadow's answers (discarded)")


def shadows_router() -> APIRouter:
    router = APIRouter(route_class=JsonRoute, tags=["deployments"])

    @router.get(
        "/deployments/{ref}/shadow",
        summary="A deployment's shadow report: live vs shadow over the same window",
        response_model=ShadowReportOut,
    )
    def get_shadow(
        request: Request, ref: str, _: Principal = Depends(require(KINDS["deployments"].read_role))
    ) -> JSONResponse:
        with read_scope(request) as session:
            return JSONResponse(svc.report(session, ref))

    return router
