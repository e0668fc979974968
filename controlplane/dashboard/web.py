"""What every dashboard page shares: templates, the signed-in principal, rendering with the
CSRF value and a Content-Security-Policy, and the server time it took (Server-Timing)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from controlplane.api.auth import Principal
from controlplane.contracts import whole_number
from controlplane.dashboard.session import can, csrf_for, principal_of, session_id
from controlplane.settings import GatewayEndpoint
from controlplane.specs import Role

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
PAGE_SIZE = 50

NAV = (
    ("overview", "/", "Overview"),
    ("map", "/map", "Map"),
    ("clusters", "/clusters", "Clusters"),
    ("pools", "/pools", "Pools & reservations"),
    ("deployments", "/deployments", "Deployments"),
    ("placement", "/placement", "Placement"),
    ("events", "/events", "Events & audit"),
    ("playground", "/playground", "Playground"),
    ("tokens", "/tokens", "Tokens"),
)


class LoginRequired(Exception):
    """The page needs a session; the app answers with a redirect to /login."""


def signed_in(request: Request) -> Principal:
    principal = principal_of(request)
    if principal is None:
        raise LoginRequired
    return principal


def to_login(request: Request, _: Exception) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"HX-Redirect": "/login"})
    return RedirectResponse(f"/login?{urlencode({'next': target}, safe='/')}", status_code=303)


def page_of(request: Request) -> int:
    raw = request.query_params.get("page", "1")
    return max(whole_number(raw, 6) or 1, 1)


def render(
    request: Request,
    template: str,
    principal: Principal | None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    started = getattr(request.state, "started", None) or time.perf_counter()
    sid = session_id(request)
    context |= {
        "principal": principal,
        "csrf": csrf_for(sid) if sid and principal else "",
        "nav": NAV,
        "can_operate": principal is not None and can(principal, Role.operator),
        "is_admin": principal is not None and can(principal, Role.admin),
        "now": datetime.now(UTC),
    }
    response = TEMPLATES.TemplateResponse(request, template, context, status_code=status_code)
    elapsed_ms = (time.perf_counter() - started) * 1000
    response.headers["Server-Timing"] = f"app;dur={elapsed_ms:.1f}"
    secure_headers(response)
    return response


def secure_headers(response: Response) -> None:
    """What every dashboard page and fragment carries (docs/dashboard.md)."""
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"


def started(request: Request) -> None:
    """A dependency: note when the request reached the page (for Server-Timing)."""
    request.state.started = time.perf_counter()


GATEWAY_TARGET = "gateway:"
"""How the playground names a global gateway among the clusters it can stream through."""


def playground_targets(
    gateways: dict[str, GatewayEndpoint], routers: dict[str, str], models: dict[str, list[str]]
) -> list[tuple[str, str]]:
    """(option value ``target|model``, label): every served model through each global gateway
    first (the fleet's endpoint: it picks the plane), then through each plane's router."""
    served = sorted({m for c, ms in models.items() if c in routers for m in ms})
    through_gateways = [
        (f"{GATEWAY_TARGET}{name}|{model}", f"{model} via gateway {name} ({gw.region})")
        for name, gw in sorted(gateways.items())
        for model in served
    ]
    through_routers = [
        (f"{cluster}|{model}", f"{model} on {cluster} (its router)")
        for cluster, ms in sorted(models.items())
        if cluster in routers
        for model in ms
    ]
    return through_gateways + through_routers
