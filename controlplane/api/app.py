"""The admin REST API's composition root: `create_app(settings)` wires everything once."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg.errors import LockNotAvailable
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.auth import TokenVerifier
from controlplane.api.costs import costs_router
from controlplane.api.docs import docs_router
from controlplane.api.fleetmetrics import FleetCollector
from controlplane.api.inventory import inventory_routers
from controlplane.api.jsonbody import BodyRefused
from controlplane.api.limits import BodyLimitMiddleware
from controlplane.api.metrics import ApiMetrics, MetricsMiddleware, metrics_router
from controlplane.api.observed import observed_routers
from controlplane.api.openapi import install as install_openapi
from controlplane.api.parameters import reject_control_characters
from controlplane.api.placement import placement_router
from controlplane.api.rollouts import rollouts_router
from controlplane.api.schemas import HealthOut
from controlplane.api.shadows import shadows_router
from controlplane.api.webhookmetrics import WebhookCollector
from controlplane.dashboard.app import install as install_dashboard
from controlplane.db.session import (
    make_engine,
    make_read_engine,
    make_read_session_factory,
    make_session_factory,
)
from controlplane.errors import (
    BadRequest,
    ControlPlaneError,
    DatabaseUnavailable,
    InvalidSpec,
    Problem,
    problem_for,
)
from controlplane.services.health import database_answers
from controlplane.services.inventory import Rendered
from controlplane.services.validation import field_errors
from controlplane.settings import Settings, db_timeouts
from gpufleet_logging import clean_request_id, new_request_id, request_id_bound

log = logging.getLogger("gpufleet.api")
PROBLEM = "application/problem+json"


def _problem_response(error: ControlPlaneError, request: Request) -> JSONResponse:
    problem = problem_for(error, instance=str(request.url.path))
    return JSONResponse(problem.to_json(), status_code=problem.status, media_type=PROBLEM)


def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return _problem_response(
            BadRequest("request body is not valid JSON; send a JSON object"), request
        )
    fields, detail = field_errors(errors, drop_first=("body",))
    return _problem_response(InvalidSpec(detail, fields), request)


HTTP_PROBLEMS = {
    400: ("Bad request", "bad-request"),
    404: ("Not found", "not-found"),
    405: ("Method not allowed", "method-not-allowed"),
}


def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (no route, wrong method, a body it cannot parse) as problems."""
    assert isinstance(exc, StarletteHTTPException)
    title, slug = HTTP_PROBLEMS.get(exc.status_code, ("Error", "http-error"))
    path = request.url.path
    if exc.status_code == 404:
        detail = f"no route {path}; the routes are listed at /api/v1/docs"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        detail = f"{request.method} is not allowed on {path}; use one of: {allowed}"
    elif isinstance(exc, BodyRefused):
        detail = str(exc.detail)
    elif exc.status_code == 400:
        detail = (
            "the request body cannot be parsed (e.g. JSON nested too deep); send a plain "
            "JSON object"
        )
    else:
        detail = str(exc.detail)
    problem = Problem(
        status=exc.status_code,
        title=title,
        detail=detail,
        type=f"https://gpufleet.dev/problems/{slug}",
        instance=path,
    )
    return JSONResponse(
        problem.to_json(), status_code=exc.status_code, media_type=PROBLEM, headers=exc.headers
    )


def _on_integrity(request: Request, exc: Exception) -> JSONResponse:
    log.warning("integrity error on %s: %s", request.url.path, type(exc).__name__)
    problem = Problem(
        status=409,
        title="Conflict",
        detail="the change conflicts with another object (a duplicate name or a reference "
        "still in use); GET the objects involved and retry",
        type="https://gpufleet.dev/problems/conflict",
        instance=str(request.url.path),
    )
    return JSONResponse(problem.to_json(), status_code=409, media_type=PROBLEM)


RETRY_AFTER_S = 5


def database_down_reason(exc: BaseException) -> str:
    """One line on why PostgreSQL did not answer (the driver's first line: no secrets)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


def _is_database_down(exc: Exception) -> bool:
    return isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def _on_database_error(request: Request, exc: Exception) -> JSONResponse:
    if not _is_database_down(exc):
        return _on_unexpected(request, exc)
    if isinstance(getattr(exc, "orig", None), LockNotAvailable):
        log.warning("lock wait timed out on %s", request.url.path)
        detail = (
            "another change held a lock on what this request changes for longer than the "
            "database's lock timeout; retry in a few seconds"
        )
    else:
        log.warning("database unavailable on %s: %s", request.url.path, database_down_reason(exc))
        detail = (
            "the control plane's database is not answering; retry in a few seconds "
            "(GET /readyz says when it is back)"
        )
    response = _problem_response(DatabaseUnavailable(detail), request)
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # runs outermost (Starlette's error middleware), after the request id was unbound
    rid = getattr(request.state, "request_id", None)
    log.exception(
        "unexpected error on %s %s", request.method, request.url.path, extra={"request_id": rid}
    )
    problem = Problem(
        status=500,
        title="Internal error",
        detail="the control plane failed unexpectedly; the error is logged with this request id",
        type="https://gpufleet.dev/problems/internal",
        instance=str(request.url.path),
    )
    headers = {"X-Request-Id": rid} if rid else None
    return JSONResponse(problem.to_json(), status_code=500, media_type=PROBLEM, headers=headers)


class RequestIdMiddleware:
    """Pure ASGI: take X-Request-Id from the request (cleaned; or make one), echo it back,
    and bind it for the request, so that every line logged meanwhile and every Celery task
    sent meanwhile carries it (`controlplane.tasks`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id")
        rid = clean_request_id(given) or new_request_id()
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        with request_id_bound(rid):
            await self.app(scope, receive, send_with_id)


def _health_router() -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz", summary="Liveness (no auth)", response_model=HealthOut)
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @router.get(
        "/readyz",
        summary="Readiness: the database answers (no auth)",
        response_model=HealthOut,
        responses={503: {"model": HealthOut, "description": "the database does not answer"}},
    )
    def readyz(request: Request) -> JSONResponse:
        try:
            with request.app.state.session_factory() as session:
                database_answers(session)
        except Exception as exc:
            log.warning("readyz: database unreachable: %s", database_down_reason(exc))
            # the kind only: the driver's line names the database's host, port and user, and
            # /readyz needs no token
            kind = type(getattr(exc, "orig", None) or exc).__name__
            return JSONResponse(
                {"status": "database unreachable", "reason": kind},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return JSONResponse({"status": "ready"})

    return router


def create_app(
    settings: Settings,
    session_factory: sessionmaker[Session] | None = None,
    extra_routers: list[APIRouter] | None = None,
    on_inventory_change: Callable[[str], None] | None = None,
    dispatch_procurement: Callable[[list[Any]], None] | None = None,
) -> FastAPI:
    """`on_inventory_change(kind)` runs after a committed change placement depends on;
    `dispatch_procurement(actions)` after an on-demand re-plan committed."""
    factory = session_factory or make_session_factory(
        make_engine(settings.database_url, settings.db_pool_size, **db_timeouts(settings))
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if session_factory is None:
            engine: Any = factory.kw.get("bind")
            if engine is not None:
                engine.dispose()

    app = FastAPI(
        title="gpufleet admin API",
        version="1",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # served below from local assets: no CDN
        redoc_url=None,
        lifespan=lifespan,
        dependencies=[Depends(reject_control_characters)],
    )
    install_openapi(app)
    app.state.session_factory = factory
    app.state.read_session_factory = make_read_session_factory(factory.kw["bind"])
    app.state.read_engine = make_read_engine(factory.kw["bind"])
    app.state.settings = settings
    app.state.verifier = TokenVerifier(factory)
    app.state.rendered = Rendered()
    app.state.on_inventory_change = on_inventory_change or (lambda kind: None)
    app.state.dispatch_procurement = dispatch_procurement or (lambda actions: None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(RequestIdMiddleware)
    app.state.metrics = ApiMetrics(fleet=FleetCollector(app.state.read_session_factory))
    app.state.metrics.fleet_registry.register(WebhookCollector(app.state.read_session_factory))
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: counts all
    app.add_exception_handler(
        ControlPlaneError,
        lambda request, exc: _problem_response(exc, request),  # type: ignore[arg-type]
    )
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(IntegrityError, _on_integrity)
    app.add_exception_handler(DBAPIError, _on_database_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.include_router(_health_router())
    app.include_router(metrics_router(app.state.metrics))
    app.include_router(docs_router())
    for router in [
        *inventory_routers(),
        *observed_routers(),
        placement_router(),
        rollouts_router(),
        shadows_router(),
        costs_router(),
        *(extra_routers or []),
    ]:
        app.include_router(router, prefix="/api/v1")  # one level: nested routers match slower
    install_dashboard(app)
    return app
