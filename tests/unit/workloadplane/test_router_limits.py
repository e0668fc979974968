"""What a client may send the router: bodies (declared or chunked) and headers are bounded
while reading, with an OpenAI-shaped error naming the limit that the client can read."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence

from workloadplane.router.httpserver import HttpServer, Limits
from workloadplane.runtime.process import free_port

SEEN: list[int] = []


async def sized_app(scope, receive, send) -> None:
    """Answers the size of the body it got (so a test sees what reached the app)."""
    message = await receive()
    SEEN.append(len(message["body"]))
    body = str(len(message["body"])).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


@contextlib.asynccontextmanager
async def serving(limits: Limits) -> AsyncIterator[int]:
    server = HttpServer(sized_app, limits=limits)
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        yield port
    finally:
        await server.close(grace_s=1)


async def answer(port: int, head: bytes, body_parts: Sequence[bytes] = ()) -> tuple[bytes, dict]:
    """Send ``head`` then each part (stopping quietly if the router shut its side); return
    the status line and the JSON body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    for part in body_parts:
        with contextlib.suppress(ConnectionError):
            writer.write(part)
            await writer.drain()
    async with asyncio.timeout(5):
        data = await reader.read()  # the router closes after a rejection
    writer.close()
    status, _, rest = data.partition(b"\r\n")
    return status, json.loads(rest.partition(b"\r\n\r\n")[2])


LIMIT = 1024 * 1024


async def test_a_declared_body_over_the_limit_gets_413_before_it_is_read():
    SEEN.clear()
    async with serving(Limits(max_body_bytes=LIMIT)) as port:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
        status, body = await answer(port, head % (20 * LIMIT), [b"x" * 65536] * 4)
    assert status == b"HTTP/1.1 413 Content Too Large"
    assert body["error"]["code"] == "request_too_large"
    assert "1 MiB" in body["error"]["message"] and "--max-body-bytes" in body["error"]["message"]
    assert SEEN == []  # the app never ran


async def test_a_chunked_body_is_stopped_once_it_passes_the_limit():
    SEEN.clear()
    chunk = b"x" * 65536
    parts = [b"%x\r\n%b\r\n" % (len(chunk), chunk)] * 32  # 2 MiB
    async with serving(Limits(max_body_bytes=LIMIT)) as port:
        head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        status, body = await answer(port, head, parts)
    assert status.startswith(b"HTTP/1.1 413")
    assert body["error"]["type"] == "invalid_request_error"
    assert SEEN == []


async def test_a_body_at_the_limit_reaches_the_app():
    SEEN.clear()
    async with serving(Limits(max_body_bytes=LIMIT)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % LIMIT)
        writer.write(b"x" * LIMIT)
        async with asyncio.timeout(5):
            data = await reader.readuntil(b"\r\n\r\n")
            data += await reader.readexactly(len(str(LIMIT)))
        writer.close()
    assert data.startswith(b"HTTP/1.1 200") and SEEN == [LIMIT]


async def test_too_many_or_too_large_headers_get_431():
    async with serving(Limits(max_headers=10, max_header_bytes=4096)) as port:
        many = b"".join(b"x-h%d: v\r\n" % i for i in range(11))
        status, body = await answer(port, b"GET /v1/models HTTP/1.1\r\n" + many + b"\r\n")
        assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
        assert (
            body["error"]["code"] == "too_many_headers" and "10 headers" in body["error"]["message"]
        )
        big = b"x-big: " + b"v" * 5000 + b"\r\n"
        status, body = await answer(port, b"GET /v1/models HTTP/1.1\r\n" + big + b"\r\n")
        assert status.startswith(b"HTTP/1.1 431") and body["error"]["code"] == "headers_too_large"
