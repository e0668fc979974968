"""`GET /costs`: what the fleet cost over a window (docs/cost.md); a thin wrapper over
services.cost_report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from controlplane import costs
from controlplane.api.auth import Principal, require
from controlplane.api.context import read_scope
from controlplane.api.jsonbody import JsonRoute
from controlplane.api.schemas import CostReportOut
from controlplane.services import cost_report
from controlplane.settings import Settings
from controlplane.specs import Role


def rates(settings: Settings) -> costs.CostRates:
    return costs.CostRates(
        egress_dollars_per_gb=settings.cost_egress_dollars_per_gb,
        storage_dollars_per_month=settings.cost_storage_dollars_per_month,
        engineering_dollars_per_month=settings.cost_engineering_dollars_per_month,
    )


def costs_router() -> APIRouter:
    router = APIRouter(route_class=JsonRoute, tags=["costs"])

    @router.get(
        "/costs",
        summary="What the fleet cost over a window, grouped; reservations, $/Mtok and TCO",
        response_model=CostReportOut,
    )
    def get_costs(
        request: Request,
        _: Principal = Depends(require(Role.viewer)),
        start: str | None = Query(
            None, alias="from", description="ISO 8601 (UTC without an offset); default: to - 7 days"
        ),
        end: str | None = Query(None, alias="to", description="ISO 8601; default: now"),
        group_by: str | None = Query(
            None, description="deployment (default), cluster, provider, pool or purchase_type"
        ),
        limit: int = Query(100, description="groups shown (1–500); the rest sum as (other)"),
    ) -> JSONResponse:
        settings: Settings = request.app.state.settings
        now = datetime.now(UTC)
        max_window = timedelta(days=settings.cost_window_max_days)
        q = cost_report.parse_query(start, end, group_by, limit, now, max_window)
        with read_scope(request) as session:
            body = cost_report.report(session, q, now, rates(settings))
        return JSONResponse(body)

    return router
