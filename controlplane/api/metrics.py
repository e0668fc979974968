"""The API process's Prometheus metrics: requests by route and code, latency histograms.

Labels are bounded: the route is the matched route's path template (``/api/v1/pools/{ref}``,
never the name in the URL), ``unmatched`` for a path no route matched, and the method is one
of the HTTP methods or ``other``. ``GET /metrics`` (any valid token: it holds the fleet's object
names and sizes besides route templates, codes and counts; no secrets, no prompts) serves
them in Prometheus' text format, with the fleet's state read from
PostgreSQL at each scrape (``fleetmetrics.FleetCollector``).

`gpufleet up` runs the API with several uvicorn worker processes: it sets
``PROMETHEUS_MULTIPROC_DIR`` (an empty directory, before the workers start), and every
worker writes its figures there and any worker's ``/metrics`` sums them all
(prometheus_client's multiprocess mode). Without it, each process counts its own.
"""

from __future__ import annotations

import os
import time

from fastapi import APIRouter, Depends
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.auth import require
from controlplane.specs import Role

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """The API's own collectors, in one registry (a test can make its own); ``fleet``: a
    collector of the fleet's state, read at each scrape (the same from every worker)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, fleet: Collector | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.fleet_registry = CollectorRegistry()
        if fleet is not None:
            self.fleet_registry.register(fleet)
        self.requests = Counter(
            "gpufleet_api_requests_total",
            "HTTP requests answered by the admin API and dashboard, by route template and code",
            ["method", "route", "code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpufleet_api_request_duration_seconds",
            "Time from a request's arrival to the end of its answer, by route template",
            ["method", "route"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gpufleet_api_requests_in_flight",
            "Requests the API is answering now",
            multiprocess_mode="livesum",
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The text to serve: this process's figures, or every worker's in multiprocess mode."""
        own = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            own = CollectorRegistry()
            MultiProcessCollector(own)
        return generate_latest(own) + generate_latest(self.fleet_registry)


def route_of(scope: Scope) -> str:
    """The matched route's full path template (``/api/v1/pools/{ref}``), or ``unmatched``.
    A route included under a prefix knows only its own part (``/pools/{ref}``): the prefix
    is the part of the request's path before the suffix that the route matched."""
    route = scope.get("route")
    template, pattern = getattr(route, "path", None), getattr(route, "path_regex", None)
    if not isinstance(template, str):
        return "unmatched"
    path = str(scope.get("path", ""))
    if pattern is None or pattern.match(path):
        return template
    for i, char in enumerate(path):
        if char == "/" and i and pattern.match(path[i:]):
            return path[:i] + template
    return template


class MetricsMiddleware:
    """Pure ASGI: counts and times every HTTP request (streams until their last byte)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        code = 500  # what the client gets when the app fails before answering

        async def recording(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = int(message["status"])
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, recording)
        finally:
            self.metrics.in_flight.dec()
            method = scope["method"] if scope["method"] in METHODS else "other"
            route = route_of(scope)
            self.metrics.requests.labels(method, route, str(code)).inc()
            self.metrics.duration.labels(method, route).observe(time.perf_counter() - started)


def metrics_router(metrics: ApiMetrics) -> APIRouter:
    """``GET /metrics`` for any valid token (viewer and up): the fleet's names and sizes are
    not public. `gpufleet up` gives Prometheus a viewer token of its own."""
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False, dependencies=[Depends(require(Role.viewer))])
    def serve() -> Response:  # sync: the thread pool, as the fleet gauges query PostgreSQL
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return router
