"""Optional error reporting to Sentry (``GPUFLEET_SENTRY_DSN``), without personal data.

``sentry-sdk`` is not one of gpufleet's dependencies: install it where you want it. With a
DSN and the package, each process reports its errors (ERROR log lines and uncaught
exceptions) tagged with its name and the request id; without the package, one warning says
so. Nothing of a request body, a cookie, a credential header or a frame's local variables
is sent: the SDK is told not to collect them, and ``scrub`` removes them again should an
integration have collected them anyway.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpufleet_logging.context import current_request_id

log = logging.getLogger("gpufleet.logging")

PACKAGE = "sentry-sdk"
_SECRET_HEADERS = frozenset(
    {"authorization", "cookie", "set-cookie", "x-api-key", "proxy-authorization"}
)


def scrub(event: dict[str, Any], hint: object = None) -> dict[str, Any]:
    """Sentry's ``before_send``: strip bodies, cookies, query strings, credential headers and
    frame variables; tag the request id."""
    request = event.get("request")
    if isinstance(request, dict):
        for key in ("data", "cookies", "query_string", "env"):
            request.pop(key, None)
        headers = request.get("headers")
        if isinstance(headers, dict):
            request["headers"] = {
                k: v for k, v in headers.items() if str(k).lower() not in _SECRET_HEADERS
            }
    for exc in (event.get("exception") or {}).get("values") or []:
        for frame in (exc.get("stacktrace") or {}).get("frames") or []:
            frame.pop("vars", None)
    # breadcrumbs: earlier log lines and HTTP calls with their URLs (a Slack webhook's path
    # is its secret); only the category and level of each stay
    crumbs = event.get("breadcrumbs")
    values = crumbs.get("values") if isinstance(crumbs, dict) else crumbs
    if isinstance(values, list):
        kept = [
            {k: c[k] for k in ("category", "level", "timestamp", "type") if k in c}
            for c in values
            if isinstance(c, dict)
        ]
        event["breadcrumbs"] = {"values": kept}
    rid = current_request_id()
    if rid:
        event.setdefault("tags", {})["request_id"] = rid
    return event


def configure_sentry(
    process: str,
    dsn: str | None,
    load: Callable[[str], ModuleType] = importlib.import_module,
) -> str:
    """Start Sentry in this process. Returns ``"off"`` (no DSN), ``"on"``, or ``"missing"``
    (a DSN but no ``sentry_sdk`` to import: one warning is logged)."""
    if not dsn:
        return "off"
    try:
        sdk = load("sentry_sdk")
    except ImportError:
        log.warning(
            "GPUFLEET_SENTRY_DSN is set but the Python package %s is not installed, so "
            "errors are not sent to Sentry: install it into this process's environment "
            "(pip install %s) or unset GPUFLEET_SENTRY_DSN",
            PACKAGE,
            PACKAGE,
        )
        return "missing"
    sdk.init(
        dsn=dsn,
        send_default_pii=False,
        include_local_variables=False,
        max_request_body_size="never",
        before_send=scrub,
    )
    sdk.set_tag("process", process)
    return "on"
