"""The API reads at most GPUFLEET_API_MAX_BODY_BYTES of a body (issue 12 item 11, issue 13
"No size limits"): driven as ASGI with a body fed chunk by chunk, counting what was read."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Body, FastAPI
from starlette.types import Message

from controlplane.api.limits import BodyLimitMiddleware

LIMIT = 64 * 1024
CHUNK = 16 * 1024


def make_app() -> BodyLimitMiddleware:
    app = FastAPI()

    @app.post("/things")
    def create(thing: dict[str, Any] = Body()) -> dict[str, int]:
        return {"keys": len(thing)}

    return BodyLimitMiddleware(app, max_bytes=LIMIT)


class Client:
    """One request through the middleware; `pulled` counts the body bytes it read."""

    def __init__(self, body: bytes, declared: bool) -> None:
        self.chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
        self.declared, self.length = declared, len(body)
        self.pulled = 0
        self.sent: list[Message] = []

    async def call(self, app: BodyLimitMiddleware) -> tuple[int, dict[str, Any]]:
        headers = [(b"content-type", b"application/json")]
        if self.declared:
            headers.append((b"content-length", str(self.length).encode()))
        else:
            headers.append((b"transfer-encoding", b"chunked"))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/things",
            "raw_path": b"/things",
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "server": ("test", 80),
            "client": ("test", 1),
        }
        await app(scope, self.receive, self.send)
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        assert sum(m["type"] == "http.response.start" for m in self.sent) == 1
        return start["status"], json.loads(body)

    async def receive(self) -> Message:
        chunk = self.chunks.pop(0)
        self.pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


def json_of_size(n: int) -> bytes:
    return json.dumps({"labels": "x" * (n - 15)}).encode()


async def test_a_body_within_the_limit_reaches_the_route():
    client = Client(json_of_size(LIMIT - 100), declared=False)
    status, body = await client.call(make_app())
    assert (status, body) == (200, {"keys": 1})


async def test_a_declared_length_above_the_limit_is_refused_before_any_byte_is_read():
    client = Client(json_of_size(14 * 1024 * 1024), declared=True)
    status, problem = await client.call(make_app())
    assert status == 413
    assert client.pulled == 0
    assert problem["limit_bytes"] == LIMIT
    assert str(LIMIT) in problem["detail"] and "GPUFLEET_API_MAX_BODY_BYTES" in problem["detail"]


async def test_a_chunked_body_is_cut_off_where_it_crosses_the_limit():
    """No Content-Length: the route's parser sees the body end early; its answer (a 400)
    is replaced by the 413, and no more than one chunk past the limit was read."""
    client = Client(json_of_size(3 * 1024 * 1024), declared=False)
    status, problem = await client.call(make_app())
    assert status == 413
    assert problem["status"] == 413 and problem["type"].endswith("/body-too-large")
    assert LIMIT < client.pulled <= LIMIT + CHUNK
