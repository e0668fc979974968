"""The request-body limit: a body above `GPUFLEET_API_MAX_BODY_BYTES` gets 413 problem+json.

Enforced while the body streams in, so no more than the limit is ever read: a declared
Content-Length above it is refused before the first byte; a chunked body (no length) is cut
off at the first chunk that crosses it, and whatever the route answers then is replaced by
the 413.
"""

from __future__ import annotations

import contextlib
import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.contracts import whole_number

SETTING = "GPUFLEET_API_MAX_BODY_BYTES"


class BodyTooLarge(Exception):
    """Raised from `receive` once the body crosses the limit; the middleware answers."""


def too_large_body(limit: int, path: str) -> bytes:
    return json.dumps(
        {
            "type": "https://gpufleet.dev/problems/body-too-large",
            "title": "Content too large",
            "status": 413,
            "detail": f"the request body is larger than {limit} bytes, the API's limit "
            f"({SETTING}); send a smaller object (field limits: docs/api.md, Limits) or "
            "raise the setting",
            "instance": path,
            "limit_bytes": limit,
        }
    ).encode()


class BodyLimitMiddleware:
    """Pure ASGI; reads at most `max_bytes` of any request body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        size = whole_number(declared, 4000) if declared is not None else None
        if size is not None and size > self.max_bytes:
            await self._answer(scope, send)
            return
        seen, over, answered = 0, False, False

        async def receive_within_limit() -> Message:
            nonlocal seen, over
            if over:
                raise BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    raise BodyTooLarge
            return message

        async def send_unless_over(message: Message) -> None:
            nonlocal answered
            if not over:
                await send(message)
            elif not answered and message["type"] == "http.response.start":
                answered = True  # the route's answer to a cut-off body is replaced
                await self._answer(scope, send)

        with contextlib.suppress(BodyTooLarge):  # what the route did not catch
            await self.app(scope, receive_within_limit, send_unless_over)
        if over and not answered:
            await self._answer(scope, send)

    async def _answer(self, scope: Scope, send: Send) -> None:
        body = too_large_body(self.max_bytes, scope.get("path", ""))
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
