"""A small synchronous client of the admin REST API (standard library only); every failure
is an ApiProblem carrying the API's RFC 9457 problem: status, title, detail, field errors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpufleet_tf.connection import Connection

API = "/api/v1"
TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str


@dataclass
class ApiProblem(Exception):
    status: int
    title: str
    detail: str
    errors: list[FieldError] = field(default_factory=list)

    def __str__(self) -> str:
        return self.detail or self.title

    @property
    def gone(self) -> bool:
        """The object does not exist: the API's own 404 says so. Any other 404 (a URL with
        /api/v1 twice, a proxy's page) is an error: read as "deleted", it dropped every
        object from the state, the secrets shown once with them."""
        return self.status == 404 and "does not exist" in self.detail


def problem_of(status: int, reason: str, raw: bytes) -> ApiProblem:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return ApiProblem(status, f"HTTP {status} {reason}", "")
    errors = [
        FieldError(str(e.get("field", "")), str(e.get("message", "")))
        for e in body.get("errors") or []
        if isinstance(e, dict)
    ]
    detail = body.get("detail")
    return ApiProblem(
        status,
        str(body.get("title") or f"HTTP {status} {reason}"),
        detail if isinstance(detail, str) else "",
        errors,
    )


class Client:
    def __init__(self, connection: Connection, timeout_s: float = TIMEOUT_S) -> None:
        if not connection.url.startswith(("http://", "https://")):
            raise ApiProblem(0, "bad url", f"{connection.url!r}: use http:// or https://")
        self.url = connection.url
        self._token = connection.token
        self._timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        if_match: int | None = None,
    ) -> tuple[Any, int]:
        """The decoded JSON answer (None for 204) and the ETag's generation (0 if none)."""
        import urllib.error  # here: most provider launches send no request
        import urllib.request

        headers = {"Accept": "application/json", "User-Agent": "terraform-provider-gpufleet"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + API + path, data, headers, method=method)  # noqa: S310
        try:
            # http(s) only: Client refuses other schemes when it is made; no redirect is
            # followed (urllib turned a POST into a GET of the list, and sent the token on)
            opener = urllib.request.build_opener(_no_redirect_handler())
            with opener.open(req, timeout=self._timeout_s) as answer:
                raw = answer.read(MAX_ANSWER_BYTES)
                etag = answer.headers.get("ETag", "").strip('"')
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = exc.headers.get("Location", "?")
                raise ApiProblem(
                    exc.code,
                    "redirected",
                    f"{self.url} answers with a redirect to {where}; give the provider that URL "
                    "(`url`, GPUFLEET_URL or `gpufleet login`) instead",
                ) from None
            problem = problem_of(exc.code, exc.reason, exc.read(MAX_ANSWER_BYTES))
            if exc.code == 401:
                problem.detail += (
                    "; set the provider's `token`, GPUFLEET_TOKEN, or run `gpufleet login`"
                )
            raise problem from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiProblem(
                0,
                "cannot reach the control plane",
                f"{self.url}: {getattr(exc, 'reason', exc)}; is `gpufleet up` running? Set the "
                "provider's `url`, GPUFLEET_URL, or run `gpufleet login`",
            ) from None
        generation = int(etag) if etag.isdigit() else 0
        return (json.loads(raw) if raw else None), generation

    def get(self, path: str) -> Any:
        return self.request("GET", path)[0]

    def list(self, path: str, **params: str) -> list[dict[str, Any]]:
        """Every item, page by page."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = "&".join(f"{k}={v}" for k, v in {**params, "limit": "500"}.items())
            page = self.get(f"/{path}?{query}" + (f"&cursor={cursor}" if cursor else ""))
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return items


def _no_redirect_handler() -> type:
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # the 3xx is raised as an HTTPError, and said what to do

    return NoRedirect
