"""The dashboard's read pages: each a shareable URL, rendered on the server from services."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from controlplane.api.context import read_scope
from controlplane.dashboard import routermetrics, traffic, worldmap
from controlplane.dashboard.assets import WORLD
from controlplane.dashboard.rates import RequestRates
from controlplane.dashboard.web import (
    PAGE_SIZE,
    page_of,
    playground_targets,
    render,
    signed_in,
    started,
)
from controlplane.errors import BadRequest, Forbidden
from controlplane.services import fleet_view, inventory, records, rollouts, shadows
from controlplane.services.records import RECORDS
from controlplane.services.resources import KINDS
from controlplane.specs import Role

RECORD = {k.path: k for k in RECORDS}
HEALTH = {"healthy": "ok", "pending": "warn", "stale": "warn", "down": "bad", "cordoned": "off"}


REVISIONS_SHOWN = 50
"""A deployment's page lists its newest revisions (the API pages through all of them)."""


def _pager(page: int, shown: int, total: int, size: int = PAGE_SIZE) -> dict[str, Any]:
    return {"page": page, "pages": max((total + size - 1) // size, 1), "total": total,
            "shown": shown}  # fmt: skip


def _request_rates(
    request: Request, urls: dict[str, str], deployments: list[str]
) -> dict[str, float]:
    """Scrape the routers whose last scrape is a second old or more (concurrently, after the
    database session), remember their counts, and give each deployment's requests/s."""
    rates: RequestRates = request.app.state.request_rates
    due = rates.due(sorted(urls))
    texts = routermetrics.fetch_all({c: f"{urls[c]}/metrics" for c in due})
    for cluster, text in texts.items():
        if text is not None:
            rates.record(cluster, routermetrics.requests_by_deployment(text))
    return rates.per_deployment(sorted(urls), deployments)


def pages_router() -> APIRouter:
    router = APIRouter(include_in_schema=False, dependencies=[Depends(started)])

    @router.get("/", response_class=HTMLResponse)
    def overview(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        with read_scope(request) as session:
            view = fleet_view.overview(session)
            recent = records.page(session, RECORD["events"], {}, 10, None)["items"]
        return render(
            request, "overview.html", principal, active="overview", view=view, recent=recent
        )

    @router.get("/map", response_class=HTMLResponse)
    def world(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        gateways = request.app.state.settings.gateway_urls
        with read_scope(request) as session:
            clusters = fleet_view.clusters(session, limit=2000)
            where = fleet_view.region_locations(session, (g.region for g in gateways.values()))
        markers = [
            {
                "cluster": c,
                "xy": worldmap.project(c.longitude, c.latitude),
                "r": worldmap.marker_radius(c.gpus),
                "health": HEALTH.get("cordoned" if c.cordoned else c.state, "warn"),
            }
            for c in clusters
        ]
        planes = {m["cluster"].name: m["xy"] for m in markers}
        texts = routermetrics.fetch_all(
            {n: f"{g.url.rstrip('/')}/metrics" for n, g in gateways.items()}
        )
        doors = []  # after the session: no network call inside a transaction
        for name, g in sorted(gateways.items()):
            if g.region not in where:
                continue
            lat, lon = where[g.region]
            xy = traffic.gateway_point(worldmap.project(lon, lat))
            text = texts.get(name)
            counts = traffic.requests_by_plane(text) if text is not None else {}
            doors.append({"name": name, "region": g.region, "xy": xy, "up": text is not None,
                          "flows": traffic.flows(xy, counts, planes)})  # fmt: skip
        return render(
            request, "map.html", principal, active="map", markers=markers, gateways=doors,
            land=worldmap.land_path_from(WORLD), width=worldmap.WIDTH, height=worldmap.HEIGHT,
        )  # fmt: skip

    @router.get("/clusters", response_class=HTMLResponse)
    def clusters(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        page = page_of(request)
        with read_scope(request) as session:
            rows = fleet_view.clusters(session, (page - 1) * PAGE_SIZE, PAGE_SIZE)
            total = fleet_view.count(session, KINDS["clusters"].row)
        return render(
            request, "clusters.html", principal, active="clusters", rows=rows, health=HEALTH,
            pager=_pager(page, len(rows), total),
        )  # fmt: skip

    @router.get("/pools", response_class=HTMLResponse)
    def pools(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        page = page_of(request)
        with read_scope(request) as session:
            rows = fleet_view.pools(session, (page - 1) * PAGE_SIZE, PAGE_SIZE)
            total = fleet_view.count(session, KINDS["pools"].row)
        return render(
            request, "pools.html", principal, active="pools", rows=rows,
            pager=_pager(page, len(rows), total),
        )  # fmt: skip

    @router.get("/deployments", response_class=HTMLResponse)
    def deployments(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        page = page_of(request)
        with read_scope(request) as session:
            rows = fleet_view.deployments(session, (page - 1) * PAGE_SIZE, PAGE_SIZE)
            total = fleet_view.count(session, KINDS["deployments"].row)
            urls = fleet_view.router_urls(session, request.app.state.settings.router_urls)
        on_page = {c for d in rows for c in d.desired}
        routers = sorted(c for c in urls if c in on_page)
        rate = _request_rates(request, {c: urls[c] for c in routers}, [d.name for d in rows])
        return render(
            request, "deployments.html", principal, active="deployments", rows=rows,
            pager=_pager(page, len(rows), total), rate=rate,
        )  # fmt: skip

    @router.get("/deployments/{name}", response_class=HTMLResponse)
    def deployment(request: Request, name: str) -> HTMLResponse:
        principal = signed_in(request)
        with read_scope(request) as session:
            row = inventory.get(session, KINDS["deployments"], name)
            body = inventory.to_json(KINDS["deployments"], row)
            revisions = records.revisions(session, name, REVISIONS_SHOWN, newest_first=True)
            revisions = revisions["items"][::-1]  # the template lists them newest first
            last = rollouts.latest(session, row.id)
            rollout = rollouts.view(last, row) if last is not None else None
            shadow = shadows.report(session, name) if shadows.shadow_of(row) else None
            replicas = records.page(
                session, RECORD["replicas"], {"deployment": name}, PAGE_SIZE, None
            )["items"]
            urls = fleet_view.router_urls(session, request.app.state.settings.router_urls)
            clusters = {c.id: c.name for c in fleet_view.cluster_names(session)}
        placed_on = {
            a["cluster"] for a in (body["status"].get("placement") or {}).get("assignments") or []
        }
        figures = routermetrics.serving(
            routermetrics.scrape({c: u for c, u in urls.items() if c in placed_on}), name
        )  # after the session: no network call inside a transaction
        return render(
            request, "deployment.html", principal, active="deployments", d=body,
            revisions=revisions[-10:], replicas=replicas, clusters=clusters, rollout=rollout,
            placement=(body["status"].get("placement") or {}), routers=urls, serving=figures,
            shadow=shadow,
        )  # fmt: skip

    @router.get("/placement", response_class=HTMLResponse)
    def placement(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        page = page_of(request)
        with read_scope(request) as session:
            plan = fleet_view.plan(session, (page - 1) * PAGE_SIZE, PAGE_SIZE)
        return render(
            request, "placement.html", principal, active="placement", plan=plan,
            pager=_pager(page, len(plan.page), plan.deployments),
        )  # fmt: skip

    @router.get("/events", response_class=HTMLResponse)
    def events(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        which = request.query_params.get("log", "events")
        if which not in ("events", "audit"):
            raise BadRequest("log must be events or audit")
        kind = RECORD[which]
        if which == "audit" and principal.role != Role.admin:
            raise Forbidden("the audit log needs the admin role")
        filters = {k: v for k, v in request.query_params.items() if k in kind.filters and v.strip()}
        cursor = request.query_params.get("cursor") or None
        with read_scope(request) as session:
            found = records.page(session, kind, filters, PAGE_SIZE, cursor)
        return render(
            request, "events.html", principal, active="events", log=which, items=found["items"],
            next_cursor=found["next_cursor"], filters=filters, filter_names=sorted(kind.filters),
        )  # fmt: skip

    @router.get("/playground", response_class=HTMLResponse)
    def playground(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        with read_scope(request) as session:
            urls = fleet_view.router_urls(session, request.app.state.settings.router_urls)
            models = records.models_by_cluster(session)
        targets = playground_targets(request.app.state.settings.gateway_urls, urls, models)
        return render(request, "playground.html", principal, active="playground", targets=targets)

    @router.get("/tokens", response_class=HTMLResponse)
    def tokens(request: Request) -> HTMLResponse:
        principal = signed_in(request)
        if principal.role != Role.admin:
            return render(request, "tokens.html", principal, active="tokens", rows=None)
        cursor = request.query_params.get("cursor") or None
        with read_scope(request) as session:
            rows, next_cursor = inventory.list_rows(session, KINDS["tokens"], {}, PAGE_SIZE, cursor)
            items = [inventory.to_json(KINDS["tokens"], r) | {"disabled": r.disabled} for r in rows]
        return render(
            request, "tokens.html", principal, active="tokens", rows=items,
            next_cursor=next_cursor, created=None,
        )  # fmt: skip

    return router
