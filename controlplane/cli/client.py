"""A small synchronous client for the admin REST API; every failure becomes one CliError line."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from controlplane.cli.config import Context
from controlplane.cli.manifests import CliError
from controlplane.contracts import strip_userinfo

API = "/api/v1"


class ApiError(CliError):
    """The API answered with a problem (RFC 9457); `status` is the HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, exit_code=1)
        self.status = status


def problem_line(response: httpx.Response) -> str:
    """The problem's detail (it names the field and the fix), else the status line."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        detail = body.get("detail")
        if isinstance(detail, str) and detail:
            return _without_kind(detail)
        if isinstance(detail, list):  # FastAPI's default shape, should an older server send it
            return "; ".join(str(d.get("msg", d)) for d in detail if isinstance(d, dict))
    return f"HTTP {response.status_code} {response.reason_phrase}"


def _without_kind(detail: str) -> str:
    """Service validation says 'invalid Pool: gpus: …'; the CLI line names the object already."""
    head, sep, rest = detail.partition(": ")
    if sep and head.startswith("invalid ") and " " not in head.removeprefix("invalid "):
        return rest
    return detail


def segment(name: str) -> str:
    """``name`` as one path segment: escaped, so that a name holding "/", "?", "#" or ".."
    names that object (the API finds none) instead of another one."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CliError(
            f"{name.encode('utf-8', 'replace').decode()!r} is not valid UTF-8; give a name as "
            "the API shows it"
        ) from None
    return quote(name, safe="").replace(".", "%2E")


def _not_a_url(url: str, exc: Exception) -> CliError:
    return CliError(
        f"{url!r} is not a URL the CLI can use ({exc}); give one like http://127.0.0.1:8080 "
        "(GPUFLEET_URL or `gpufleet login --url`)"
    )


def _cause(exc: httpx.ConnectError) -> str:
    """Why a connection failed, in a few words (a refused port, a name that does not resolve,
    an untrusted certificate, a proxy)."""
    text = str(exc).lower()
    if "certificate" in text or "ssl" in text:
        return "its TLS certificate is not trusted: set SSL_CERT_FILE to its CA"
    if (
        "name or service not known" in text
        or "nodename nor servname" in text
        or "resolution" in text
    ):
        return "the host name does not resolve"
    if "refused" in text:
        return "connection refused"
    return strip_userinfo(str(exc))[:120] or type(exc).__name__


CONNECT_TIMEOUT_S = 3.0
DEFAULT_TIMEOUT_S = 15.0
"""How long the CLI waits for an answer; GPUFLEET_CLI_TIMEOUT (seconds) changes it."""


def answer_timeout_s() -> float:
    configured = os.environ.get("GPUFLEET_CLI_TIMEOUT", "")
    try:
        value = float(configured) if configured else DEFAULT_TIMEOUT_S
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:  # nan, inf, 0 and below were a traceback at the first request
        raise CliError(
            f"GPUFLEET_CLI_TIMEOUT={configured!r} is not a number of seconds from 0 to 3600; "
            "set e.g. 30"
        )
    return value


class Client:
    def __init__(self, context: Context, timeout_s: float | None = None) -> None:
        self.url = context.url
        self.shown = strip_userinfo(context.url)  # in messages: never a user:password
        self.timeout_s = answer_timeout_s() if timeout_s is None else timeout_s
        if context.token and not context.token.isascii():  # httpx: a UnicodeEncodeError
            raise CliError(
                "the token has characters other than ASCII, so it is not a gpufleet token; "
                "check GPUFLEET_TOKEN or `gpufleet login`"
            )
        headers = {"Authorization": f"Bearer {context.token}"} if context.token else {}
        headers["User-Agent"] = "gpufleet-cli"
        timeout = httpx.Timeout(self.timeout_s, connect=min(CONNECT_TIMEOUT_S, self.timeout_s))
        self.source = context.source
        try:
            self._http = httpx.Client(base_url=context.url + API, headers=headers, timeout=timeout)
        except httpx.InvalidURL as exc:
            raise _not_a_url(self.shown, exc) from None
        except Exception as exc:  # a proxy, certificate or other setting of the environment
            raise CliError(
                f"cannot set up a connection to {self.shown}: {type(exc).__name__}: "
                f"{strip_userinfo(str(exc))[:200]}; check HTTP_PROXY, HTTPS_PROXY, ALL_PROXY "
                "and SSL_CERT_FILE"
            ) from None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def request(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        """Send one request; `what` names the object in error lines ("pools 'gpu-a'")."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.InvalidURL as exc:
            raise _not_a_url(self.shown, exc) from None
        except UnicodeEncodeError:
            raise CliError(
                "an argument (a name or a --where value) is not valid UTF-8; give it as the "
                "API shows it"
            ) from None
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the control plane at {self.shown} ({_cause(exc)}); is "
                "`gpufleet up` running? (or set GPUFLEET_URL, or run `gpufleet login --url`)"
            ) from exc
        except httpx.ConnectTimeout as exc:
            raise CliError(
                f"the API at {self.shown} did not accept a connection in "
                f"{min(CONNECT_TIMEOUT_S, self.timeout_s):.0f} s; is the address right and "
                "the control plane running?"
            ) from exc
        except httpx.TimeoutException as exc:
            raise CliError(
                f"the API at {self.shown} did not answer in {self.timeout_s:.0f} s; it may be "
                "overloaded or stopped (`gpufleet up` shows its status); set "
                "GPUFLEET_CLI_TIMEOUT to wait longer"
            ) from exc
        except httpx.HTTPError as exc:
            raise CliError(f"request to {self.shown} failed: {exc}") from exc
        if 300 <= response.status_code < 400:  # httpx follows none: nothing was done
            to = strip_userinfo(response.headers.get("location", "(no Location)"))[:200]
            raise ApiError(
                f"{self.shown} answered {response.status_code}, a redirect to {to}: nothing "
                "was done; use that URL (GPUFLEET_URL or `gpufleet login --url`)",
                response.status_code,
            )
        if response.status_code >= 400:
            prefix = f"{what}: " if what else ""
            message = prefix + problem_line(response)
            if response.status_code == 401:
                message += "; " + self._token_hint()
            raise ApiError(message, response.status_code)
        return response

    def _token_hint(self) -> str:
        """What to do about a refused token, by where it came from (never on a command line:
        it would stay in the shell's history)."""
        if "GPUFLEET_TOKEN" in self.source:
            return "the token comes from GPUFLEET_TOKEN: set it to a valid token, or unset it"
        return f"run `gpufleet login --url {self.shown}` (it asks for the token)"

    def get(self, path: str, what: str = "", params: Mapping[str, Any] | None = None) -> Any:
        return self.json_of(self.request("GET", path, what, params=params))

    def json_of(self, response: httpx.Response) -> Any:
        """The answer's JSON (a proxy's HTML page is named, not a traceback)."""
        try:
            return response.json()
        except ValueError:
            raise self._not_the_api(response) from None

    def _not_the_api(self, response: httpx.Response) -> CliError:
        kind = response.headers.get("content-type", "no content type")
        return CliError(
            f"{self.shown} answered {response.status_code} with {kind:.60}, not the API's JSON: "
            "is it a gpufleet control plane? (GPUFLEET_URL or `gpufleet login --url`)"
        )

    def find(self, path: str, ref: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(f"/{path}/{segment(ref)}", f"{path} '{ref}'")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, path: str, params: Mapping[str, Any] | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        return list(self.iterate(path, params, limit))

    def iterate(
        self, path: str, params: Mapping[str, Any] | None = None, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every item, page by page, stopping after `limit` items when given."""
        query = dict(params or {})
        page_size = min(limit or 500, 500)
        seen = 0
        while True:
            page = self.get(f"/{path}", path, params={**query, "limit": page_size})
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise CliError(
                    f"{self.shown} answered a page without items: is it the gpufleet API?"
                )
            for item in page["items"]:
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if not page.get("next_cursor"):
                return
            query["cursor"] = page["next_cursor"]

    def put(self, path: str, name: str, body: Mapping[str, Any], generation: int | None) -> Any:
        headers = {"If-Match": f'"{generation}"'} if generation is not None else {}
        return self.json_of(
            self.request(
                "PUT",
                f"/{path}/{segment(name)}",
                f"{path} '{name}'",
                json=dict(body),
                headers=headers,
            )
        )

    def delete(self, path: str, name: str, force: bool = False) -> None:
        params = {"force": "true"} if force else None
        self.request("DELETE", f"/{path}/{segment(name)}", f"{path} '{name}'", params=params)
