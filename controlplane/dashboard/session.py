"""Dashboard sessions: an API token exchanged for a server-side session, and the CSRF value
bound to it.

The cookie (HttpOnly, SameSite=Strict, Secure behind TLS) carries a random session id; the
database keeps its SHA-256, the token it speaks for and its expiry (`SESSION_LIFETIME`).
Logging out deletes the row, so a copy of the cookie stops working at once in this process
and within the cache time (5 s) in others; a disabled, expired or deleted token ends its
sessions the same way. The CSRF value is an HMAC of the session id's hash, so it is known
only to a page the session rendered; every write must send it back.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import Response

from controlplane.api.auth import RANK, Principal
from controlplane.contracts import whole_number
from controlplane.errors import BadRequest, Forbidden
from controlplane.services.inventory import hash_token
from controlplane.services.sessions import SessionStore
from controlplane.specs import Role

COOKIE = "gpufleet_session"
MAX_FORM_FIELDS = 50


def csrf_for(session_id: str) -> str:
    """The CSRF value of a session: derived from its id, never the id itself."""
    return hmac.new(
        hash_token(session_id).encode(), b"gpufleet-dashboard-csrf", hashlib.sha256
    ).hexdigest()


def session_id(request: Request) -> str | None:
    return request.cookies.get(COOKIE) or None


def principal_of(request: Request) -> Principal | None:
    """Who the session's cookie speaks for; None without a valid one."""
    sid = session_id(request)
    if not sid:
        return None
    store: SessionStore = request.app.state.dashboard_sessions
    token = store.token(sid)
    if token is None:
        return None
    principal = Principal(token.id, token.name, token.role)
    request.state.principal = principal
    return principal


def can(principal: Principal, role: Role) -> bool:
    return RANK[principal.role] >= RANK[role]


def is_own_origin(request: Request, origin: str) -> bool:
    """``origin`` is this dashboard's: its own scheme, or ``https`` when a proxy in front
    says so (``X-Forwarded-Proto``: a cross-site form cannot set that header), same host."""
    netloc = request.url.netloc
    schemes = {request.url.scheme}
    if request.headers.get("x-forwarded-proto") == "https":
        schemes.add("https")
    return origin in {f"{scheme}://{netloc}" for scheme in schemes}


def set_session(response: Response, request: Request, session_id: str) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https",
        path="/",
    )


def end_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form (the body limit bounds it), first value per field."""
    body = (await request.body()).decode("utf-8", errors="replace")
    try:
        fields = parse_qsl(body, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except ValueError:  # too many fields: a 500 with a traceback, no login needed
        raise BadRequest(f"a form has at most {MAX_FORM_FIELDS} fields") from None
    form: dict[str, str] = {}
    for key, value in fields:
        form.setdefault(key, value)
    return form


def check_write(request: Request, principal: Principal, role: Role, sent: str | None) -> None:
    """Every write: the session's CSRF value, the same origin, and the role it needs."""
    sid = session_id(request) or ""
    # as bytes: compare_digest refuses non-ASCII str (a TypeError, a 500, for `csrf=é`)
    if not sent or not hmac.compare_digest(sent.encode(), csrf_for(sid).encode()):
        raise Forbidden("the form's CSRF value is missing or stale; reload the page and retry")
    origin = request.headers.get("origin")
    if origin and not is_own_origin(request, origin):
        raise Forbidden(f"a write from another origin ({origin}) is refused")
    if not can(principal, role):
        raise Forbidden(
            f"this needs the {role.value} role; token '{principal.name}' is "
            f"{principal.role.value}. Ask an admin for a token with role {role.value}"
        )


def integer(form: dict[str, str], name: str, low: int = 0, high: int = 1_000_000) -> int:
    raw = form.get(name, "").strip()
    size = whole_number(raw.removeprefix("-"))
    value = None if size is None else -size if raw.startswith("-") else size
    if value is None or not low <= value <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, got {raw!r}")
    return value
