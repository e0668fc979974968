"""OpenAI-shaped error bodies: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


class ResponseCut(Exception):
    """Raised by the app when an answer broke after its head went out: the connection is
    closed (a client must not take a cut body for a whole one, nor wait for the rest)."""


BAD_REQUEST = 400, "invalid_request_error"
UNAUTHORIZED = 401, "authentication_error"
FORBIDDEN = 403, "permission_error"
NOT_FOUND = 404, "invalid_request_error"
QUEUE_FULL = 429, "rate_limit_error"
NO_CAPACITY = 503, "service_unavailable_error"
QUEUE_TIMEOUT = 504, "timeout_error"
BAD_GATEWAY = 502, "upstream_error"
