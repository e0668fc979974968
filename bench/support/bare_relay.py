"""The floor for a Python front in ``bench/failover.py`` (a): the least an HTTP relay on the
gateway's own stack (uvloop, httptools) can do per request — parse the request, read its
JSON for ``model``, rewrite the headers as the gateway does (drop hop-by-hop ones, add a
request id, a tier and a content length) and forward it on one kept-alive connection to one
plane; parse the answer and write it back whole with its own headers. No choice, no
metrics, no failover: not a product, a yardstick. Printed next to the gateway and HAProxy,
it says how much of the gateway's added latency is Python's floor on these cores and how
much is the gateway's own work.

``python bench/support/bare_relay.py LISTEN_PORT UPSTREAM_PORT``
"""

from __future__ import annotations

import asyncio
import json
import sys

import httptools
import uvloop

_DROP_REQUEST = {b"host", b"content-length", b"connection", b"authorization", b"x-request-id"}
_DROP_RESPONSE = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}
_DROP_RESPONSE |= {b"x-request-id", b"content-length"}


class _Message(asyncio.Protocol):
    """Collects one HTTP message's headers and body from the parser's callbacks."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def on_message_begin(self) -> None:
        self.headers, self.body = [], []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)


class _Upstream(_Message):
    def __init__(self, client: _Client) -> None:
        super().__init__()
        self.client = client
        self.parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client.ready(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        out = [b"HTTP/1.1 %d OK\r\n" % self.parser.get_status_code()]
        for name, value in self.headers:
            if name not in _DROP_RESPONSE:
                out += (name, b": ", value, b"\r\n")
        out += (b"x-request-id: ", self.client.request_id, b"\r\n")
        out += (b"content-length: %d\r\n\r\n" % len(body), body)
        self.client.write(b"".join(out))


class _Client(_Message):
    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: _Upstream | None = None
        self.waiting = b""
        self.url = b""
        self.request_id = b""
        self.model = ""
        self.connecting: asyncio.Task[object] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        self.connecting = loop.create_task(
            loop.create_connection(lambda: _Upstream(self), "127.0.0.1", self.upstream_port)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def ready(self, upstream: _Upstream) -> None:
        self.upstream = upstream
        if self.waiting and upstream.transport is not None:
            upstream.transport.write(self.waiting)
            self.waiting = b""

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.model = json.loads(body)["model"]  # read as the gateway reads it
        out = [b"POST ", self.url, b" HTTP/1.1\r\nhost: 127.0.0.1\r\n"]
        request_id = b""
        for name, value in self.headers:
            if name == b"x-request-id":
                request_id = value
            elif name not in _DROP_REQUEST:
                out += (name, b": ", value, b"\r\n")
        self.request_id = request_id or b"%032x" % id(body)
        out += (b"x-request-id: ", self.request_id, b"\r\nx-priority: 1\r\n")
        out += (b"content-length: %d\r\n\r\n" % len(body), body)
        data = b"".join(out)
        if self.upstream is None or self.upstream.transport is None:
            self.waiting += data
        else:
            self.upstream.transport.write(data)


async def _serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: _Client(upstream_port), "127.0.0.1", port)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(_serve(int(sys.argv[1]), int(sys.argv[2])))
