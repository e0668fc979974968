"""The OpenAPI document, made to tell the truth about errors and authentication.

FastAPI documents only each route's success and a 422 in its own `{"detail": …}` shape. Every
error this API sends is RFC 9457 problem JSON (`application/problem+json`), so each operation
gets the error statuses it can really answer with, all with the `Problem` schema, and every
route behind a token names the HTTP bearer scheme (which gives the docs page its Authorize
button). tests/integration/api/test_fuzz.py holds the document to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI

from controlplane.api.schemas import ProblemOut

PROBLEM = "application/problem+json"
WRITES = frozenset({"post", "put", "patch", "delete"})
ERRORS = {
    "400": "The request cannot be read: a body that is not JSON or is nested too deep, an "
    "unknown filter, a bad cursor or If-Match",
    "401": "No valid bearer token",
    "403": "The token's role is not enough",
    "404": "No such object",
    "409": "Conflicts with the current state (a duplicate, a stale If-Match, an object in use)",
    "413": "The body is larger than GPUFLEET_API_MAX_BODY_BYTES (1 MiB by default)",
    "422": "A field or parameter is invalid; `errors` names each one and what to change",
    "500": "The control plane failed unexpectedly (logged with the request id)",
    "503": "The database does not answer; retry after Retry-After seconds",
}


def install(app: FastAPI) -> None:
    """Replace `app.openapi` by one that amends FastAPI's document once, then caches it."""
    default: Callable[[], dict[str, Any]] = app.openapi
    amended: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not amended:
            amended.append(truthful(default()))
        return amended[0]

    app.openapi = openapi  # type: ignore[method-assign]


def truthful(doc: dict[str, Any]) -> dict[str, Any]:
    """Add the Problem responses to every operation of FastAPI's document `doc`."""
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    problem = ProblemOut.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            token = "security" in operation  # auth.require declares the bearer scheme
            responses = operation.setdefault("responses", {})
            for status in _errors_of(path, method, operation, token):
                if status == "503" and "503" in responses:
                    continue  # /readyz says so in its own body
                responses[status] = {
                    "description": ERRORS[status],
                    "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                }
    return doc


def _errors_of(path: str, method: str, operation: dict[str, Any], token: bool) -> Iterator[str]:
    params = {p["name"] for p in operation.get("parameters", [])}
    yield "422"  # every route refuses control characters in its query
    yield "500"
    if path == "/healthz":
        return
    yield "503"
    if token:
        yield from ("401", "403")
    if "{" in path:
        yield "404"
    if "cursor" in params or "requestBody" in operation or method in WRITES:
        yield "400"
    if "requestBody" in operation or method in ("post", "put", "patch"):
        yield "413"  # the body limit (controlplane.api.limits) applies to any body
    if method in WRITES or path.endswith("/replan"):
        yield "409"
