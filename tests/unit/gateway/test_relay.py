"""The gateway's callback path (``GatewayApp.fast`` → ``_Relay``) on real sockets: a real
``HttpServer`` with the gateway app in front of scripted planes (asyncio servers on
localhost that answer, refuse, hang or break as each test says). A non-streamed request
whose first plane has a kept-alive connection takes this path; each test warms that
connection first, then checks what a client sees when the plane misbehaves."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httptools
import pytest

from controlplane.contracts import DeploymentRoute, PlaneRoute, RegionPoint, RoutingTable
from workloadplane.gateway.app import GatewayApp, GatewayConfig
from workloadplane.gateway.state import GatewayState, RoutesStore
from workloadplane.router.httpserver import HttpServer
from workloadplane.router.keys import KeyGrant, hash_key

pytestmark = pytest.mark.asyncio(loop_scope="session")

ANSWER = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()


class ScriptedPlane(asyncio.Protocol):
    """One connection to a scripted plane: each whole request takes the next action."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.plane.connections.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.plane.closed += 1

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.plane.requests += 1
        kind, arg = self.plane.script.popleft() if self.plane.script else ("ok", ANSWER)
        assert self.transport is not None
        if kind == "ok":
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nx-plane: %s\r\n\r\n%s"
                % (len(arg), self.plane.name.encode(), arg)
            )
        elif kind == "status":
            self.transport.write(
                b"HTTP/1.1 %d Busy\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                % int(arg)
            )
        elif kind == "close":  # read the request, answer nothing
            self.transport.close()
        elif kind == "partial":  # a head promising 100 bytes, 10 of them, then gone
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
            self.transport.close()
        elif kind == "sse_done_drop":  # a whole stream, [DONE] included, then the
            # connection drops before the chunked terminator (a plane router killed then)
            events = arg + b"data: [DONE]\n\n"
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(events), events)
            )
            self.transport.close()
        elif kind == "until_close":  # no length: the body ends when the plane closes
            self.transport.write(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n" + arg)
            self.transport.close()
        elif kind == "head_close":  # a head promising 100 bytes, none of them, then gone
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
            self.transport.close()
        elif kind == "head_stall":  # a head promising 100 bytes, 10 of them, then silence
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
        elif kind == "sse_silent":  # a stream's head and first event, then silence
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(arg), arg)
            )
        # "hang": nothing


class Plane:
    def __init__(self, name: str) -> None:
        self.name = name
        self.script: collections.deque[tuple[str, bytes]] = collections.deque()
        """(action, its argument): ("ok", body), ("status", b"429"), ("close", b""),
        ("partial", b""), ("hang", b"")."""
        self.connections: list[ScriptedPlane] = []
        self.requests = 0
        self.closed = 0
        self.port = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: ScriptedPlane(self), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for c in self.connections:
            if c.transport is not None:
                c.transport.close()


class Front:
    """The gateway as ``gpufleet gateway`` serves it (``HttpServer(fast=app.fast)``) over
    planes ``a`` (near, ranked first) and ``b`` (far)."""

    def __init__(self, tmp: Path, a: Plane, b: Plane) -> None:
        self.clock_now = 100.0
        self.state = GatewayState("near", lambda: self.clock_now, RoutesStore(tmp))
        regions = [
            RegionPoint(name="near", latitude=0, longitude=0, jurisdiction="US"),
            RegionPoint(name="far", latitude=0, longitude=90, jurisdiction="US"),
        ]
        planes = [
            PlaneRoute(cluster=p.name, endpoint=f"http://127.0.0.1:{p.port}", region=r.name,
                       jurisdiction="US", latitude=r.latitude, longitude=r.longitude, replicas=1)
            for p, r in ((a, regions[0]), (b, regions[1]))
        ]  # fmt: skip
        table = RoutingTable(
            generation=1,
            deployments=[DeploymentRoute(name="chat", planes=planes)],
            regions=regions,
        )
        assert self.state.apply_table(table.model_dump_json().encode())
        self.app = GatewayApp(self.state, GatewayConfig())
        self.server = HttpServer(self.app, fast=self.app.fast)
        self.port = 0

    async def start(self) -> None:
        await self.server.start("127.0.0.1", 0)
        assert self.server._server is not None
        self.port = self.server._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        await self.server.close(grace_s=0.5)
        self.state.close()


class Client:
    """One keep-alive client connection, reading whole responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def send(
        self,
        body: dict[str, object] | None = None,
        extra: bytes = b"",
        path: bytes = b"/v1/chat/completions",
    ) -> None:
        raw = json.dumps(body or {"model": "chat", "messages": []}).encode()
        self.writer.write(
            b"POST %s HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"%scontent-length: %d\r\n\r\n%s" % (path, extra, len(raw), raw)
        )

    async def answer(self) -> tuple[int, dict[bytes, bytes], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            body = await self.reader.readexactly(int(headers[b"content-length"]))
        else:  # chunked
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            body = b"".join(parts)
        return status, headers, body

    async def ask(
        self, body: dict[str, object] | None = None
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        self.send(body)
        return await self.answer()


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll a real asynchronous event on the sockets, bounded."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.005)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Front, Plane, Plane, Client]]:
    a, b = Plane("a"), Plane("b")
    await a.start()
    await b.start()
    front = Front(tmp_path, a, b)
    await front.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
    client = Client(reader, writer)
    status, headers, _ = await client.ask()  # opens the kept-alive connection to a
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"a"
    try:
        yield front, a, b, client
    finally:
        writer.close()
        await front.close()
        a.close()
        b.close()


async def test_an_answer_comes_whole_with_the_route_headers_on_the_kept_alive_connection(fleet):
    front, a, _, client = fleet
    client.send(extra=b"x-request-id: req-42\r\n")
    status, headers, body = await client.answer()
    assert status == 200 and body == ANSWER
    assert headers[b"x-gpufleet-plane"] == b"a" and headers[b"x-request-id"] == b"req-42"
    assert headers[b"x-gpufleet-route"] and headers[b"x-plane"] == b"a"
    assert headers[b"content-length"] == b"%d" % len(ANSWER)
    assert front.state.planes["a"].pool.connections_opened == 1  # kept alive, reused
    assert a.requests == 2
    served = front.state.metrics.registry.get_sample_value(
        "gpufleet_gateway_requests_total", {"deployment": "chat", "plane": "a", "code": "200"}
    )
    assert served == 2


async def test_pipelined_requests_are_answered_in_order(fleet):
    _, a, _, client = fleet
    a.script.extend([("ok", b'{"n": 1}'), ("ok", b'{"n": 2}')])
    client.send()
    client.send()
    assert (await client.answer())[2] == b'{"n": 1}'
    assert (await client.answer())[2] == b'{"n": 2}'


async def test_a_stream_asked_for_and_answered_in_json_comes_whole(fleet):
    """Embeddings never stream: a plane answers ``stream: true`` there in JSON, which the
    gateway's event relay dropped (the client got only a stream_broken event)."""
    _, a, _, client = fleet
    a.script.append(("ok", b'{"data": [{"embedding": [0.5]}]}'))
    client.send({"model": "chat", "input": "hi", "stream": True}, path=b"/v1/embeddings")
    status, _, body = await client.answer()
    assert status == 200 and body == b'{"data": [{"embedding": [0.5]}]}'


async def test_a_429_before_any_byte_moves_the_request_to_the_next_plane(fleet):
    front, a, b, client = fleet
    a.script.append(("status", b"429"))
    status, headers, _ = await client.ask()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"b"
    assert not front.state.planes["a"].health.ejected  # busy is not dead
    assert b.requests == 1


async def test_a_kept_alive_connection_closed_under_the_request_is_replaced_not_failed(fleet):
    front, a, b, client = fleet
    a.script.append(("close", b""))  # the plane closed it as the request arrived
    status, headers, _ = await client.ask()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"a"  # on a fresh connection
    assert front.state.planes["a"].pool.connections_opened == 2
    assert not front.state.planes["a"].health.ejected and b.requests == 0


async def test_a_waiting_request_moves_when_its_plane_is_taken_out_of_rotation(fleet):
    front, a, _, client = fleet
    a.script.append(("hang", b""))
    client.send()
    await until(lambda: a.requests == 2)  # it reached the plane, which says nothing
    front.state.failed("a", "probe timed out")
    status, headers, body = await client.answer()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"b" and body == ANSWER
    assert not front.state.planes["a"].attempts


async def test_a_plane_that_breaks_after_sending_bytes_gets_a_502_not_a_retry(fleet):
    _, a, b, client = fleet
    a.script.append(("partial", b""))
    status, headers, body = await client.ask()
    assert status == 502 and headers[b"x-gpufleet-plane"] == b"a"
    error = json.loads(body)["error"]
    assert error["code"] == "upstream_failed" and "send it again" in error["message"]
    assert b.requests == 0  # it may have run on a: never run twice


async def test_a_long_answer_goes_through_whole(fleet):
    _, a, _, client = fleet
    long = json.dumps({"data": "x" * (3 * 1024 * 1024)}).encode()
    a.script.append(("ok", long))
    status, _, body = await client.ask()
    assert status == 200 and body == long


async def test_a_slow_client_holds_a_long_answer_back_at_the_plane_not_in_the_gateway(fleet):
    """32 MiB to a client that reads nothing for a while: the gateway pauses the plane once
    the client's socket is full, so the plane keeps most of it unsent and the gateway holds
    little; when the client reads, all of it arrives, whole and in order."""
    front, a, _, client = fleet
    long = json.dumps({"data": "x" * (32 * 1024 * 1024)}).encode()
    a.script.append(("ok", long))
    client.send()
    await until(lambda: a.requests == 2)
    plane_side = a.connections[-1].transport
    assert plane_side is not None
    (front_side,) = [c for c in front.server.connections if c.transport is not None]
    held: list[int] = []

    def settled() -> bool:  # what the plane could not send stopped moving for 100 ms
        held.append(plane_side.get_write_buffer_size())
        return len(held) > 20 and len(set(held[-20:])) == 1

    await until(settled, timeout_s=10)
    assert held[-1] > 8 * 1024 * 1024, held[-1]  # kernel buffers hold a few MiB at most
    assert front_side.transport.get_write_buffer_size() < 2 * 1024 * 1024
    status, _, body = await client.answer()
    assert status == 200 and body == long
    await until(lambda: plane_side.get_write_buffer_size() == 0)


async def test_a_client_that_leaves_closes_its_request_at_the_plane(fleet):
    front, a, _, client = fleet
    a.script.append(("hang", b""))
    client.send()
    await until(lambda: a.requests == 2)
    closed = a.closed
    client.writer.close()
    await until(lambda: a.closed > closed)  # the plane sees the request's connection go
    assert not front.state.planes["a"].attempts
    gone = front.state.metrics.registry.get_sample_value(
        "gpufleet_gateway_requests_total", {"deployment": "chat", "plane": "a", "code": "499"}
    )
    assert gone == 1


STREAM = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def _leave_and_see_the_plane_dropped(
    front: Front, a: Plane, client: Client, began: Callable[[], object], plane: str
) -> None:
    """Send a stream, wait for ``began``, close the client: the plane's connection closes,
    no attempt is left, and the answer counts as a 499 (of ``plane``: "" before a head)."""
    client.send(STREAM)
    await began()  # type: ignore[misc]
    closed = a.closed
    client.writer.close()
    await until(lambda: a.closed > closed)
    await until(lambda: not front.state.planes["a"].attempts)
    gone = front.state.metrics.registry.get_sample_value(
        "gpufleet_gateway_requests_total", {"deployment": "chat", "plane": plane, "code": "499"}
    )
    assert gone == 1


async def test_a_stream_whose_client_leaves_before_the_head_is_dropped_at_the_plane(fleet):
    """The task path (a stream) waited for the plane's head whatever the client did: a
    plane queueing the request ran it for nobody, a hung one held it for good."""
    front, a, _, client = fleet
    a.script.append(("hang", b""))
    await _leave_and_see_the_plane_dropped(
        front, a, client, lambda: until(lambda: a.requests == 2), plane=""
    )


async def test_a_silent_stream_ends_at_the_plane_when_its_client_leaves(fleet):
    """A stream whose plane went quiet (hung) was only checked for its client after the
    next chunk: none came, and the task and both connections were held for good."""
    front, a, _, client = fleet
    a.script.append(("sse_silent", b'data: {"choices": []}\n\n'))
    began = lambda: asyncio.wait_for(client.reader.readuntil(b"data: "), 5)  # noqa: E731
    await _leave_and_see_the_plane_dropped(front, a, client, began, plane="a")


async def test_a_refused_request_gets_its_error_on_the_same_connection(fleet):
    _, a, _, client = fleet
    status, _, body = await client.ask({"model": "nope"})
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, headers, _ = await client.ask()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"a" and a.requests == 2


async def test_a_failing_callback_path_answers_500_and_closes(fleet, monkeypatch):
    front, _, _, client = fleet

    def broken(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(front.app, "_admit", broken)
    status, headers, body = await client.ask()
    assert status == 500 and headers[b"connection"] == b"close" and body
    assert await client.reader.read() == b""  # closed: nothing half-answered is reused


async def test_with_keys_every_route_but_health_and_metrics_wants_one(fleet):
    front, a, _, client = fleet
    front.app.config.api_keys = {
        hash_key("k-us"): KeyGrant(0, frozenset({"US"})),
        hash_key("k-de"): KeyGrant(1, frozenset({"DE"})),
    }

    async def get(path: bytes, key: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
        auth = b"authorization: Bearer %s\r\n" % key if key else b""
        client.writer.write(b"GET %s HTTP/1.1\r\nhost: gw\r\n%s\r\n" % (path, auth))
        return await client.answer()

    for path in (b"/v1/models", b"/debug/routes?model=chat"):
        status, headers, body = await get(path)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        assert headers[b"x-request-id"]
        assert (await get(path, b"k-us"))[0] == 200
    assert (await get(b"/health"))[0] == 200
    client.send()
    status, _, body = await client.answer()
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    client.send(extra=b"authorization: Bearer k-us\r\n")
    status, headers, _ = await client.answer()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"a"
    client.send(extra=b"authorization: Bearer k-de\r\n")  # its residency: no plane allowed
    status, _, body = await client.answer()
    assert status == 503 and "DE" in json.loads(body)["error"]["message"]
    assert a.requests == 2  # only the first request and k-us's reached a plane
    # the ranking shown is the one the key's requests get: no US plane for k-de
    status, _, body = await get(b"/debug/routes?model=chat", b"k-de")
    seen = json.loads(body)
    assert status == 200 and seen["ranking"] == [] and seen["allowed_jurisdictions"] == ["DE"]
    status, _, body = await get(b"/debug/routes?model=chat&jurisdiction=US", b"k-de")
    assert status == 400 and json.loads(body)["error"]["code"] == "jurisdiction_not_allowed"


async def test_a_jurisdiction_header_must_be_a_short_list_of_country_codes(fleet):
    """Each distinct list keys the gateway's ranking cache and is named in its answers: a
    60 KB header of made-up codes held ~1.6 MB per request there before it was bounded."""
    front, _, _, client = fleet
    for bad in (b",".join(b"Q%c" % (65 + i % 26) for i in range(17)), b"DEU", b"D\xc3\xa9"):
        client.send(extra=b"x-gpufleet-jurisdiction: %s\r\n" % bad)
        status, _, body = await client.answer()
        error = json.loads(body)["error"]
        assert status == 400 and error["code"] == "invalid_jurisdiction", bad
        assert "two-letter country codes" in error["message"]
    assert not any("DEU" in str(key) for key in front.state._choices)
    client.send(extra=b"x-gpufleet-jurisdiction: us, US\r\n")  # a valid list still routes
    status, headers, _ = await client.answer()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"a"
    # sent twice, the header is one list (RFC 9110), not its last line: DE alone has no plane
    client.send(extra=b"x-gpufleet-jurisdiction: US\r\nx-gpufleet-jurisdiction: DE\r\n")
    status, headers, _ = await client.answer()
    assert status == 200 and headers[b"x-gpufleet-plane"] == b"a"
    assert any(key[2] == frozenset({"DE", "US"}) for key in front.state._choices)


async def test_a_plain_answer_that_breaks_on_the_task_path_closes_the_connection(fleet):
    """Its head promised 100 bytes and 10 came: kept alive, the client waited for the rest
    (or read the next answer as this one's tail)."""
    front, a, _, client = fleet
    taken = front.state.planes["a"].pool.take_idle()  # no idle connection: the task path
    assert taken is not None
    a.script.append(("partial", b""))
    client.send()
    try:
        async with asyncio.timeout(5):
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await client.answer()
    finally:
        taken.close()


async def test_a_plain_answer_that_breaks_before_its_body_on_the_task_path_is_a_502(fleet):
    """Nothing of the answer went out: the client gets an OpenAI-shaped 502 (it was a
    plain-text 500 and a traceback in the log)."""
    front, a, b, client = fleet
    taken = front.state.planes["a"].pool.take_idle()  # no idle connection: the task path
    assert taken is not None
    a.script.append(("head_close", b""))
    try:
        status, headers, body = await client.ask()
    finally:
        taken.close()
    assert status == 502 and headers[b"x-request-id"]
    assert json.loads(body)["error"]["code"] == "upstream_failed"
    assert b.requests == 0  # it may have run on a: never run twice


async def test_when_every_attempt_finds_a_busy_plane_the_client_gets_the_last_429(fleet):
    """Attempts are bounded (``max_attempts``); the last one's 429 is the answer (with its
    retry-after), not a 502 naming a plane that did answer."""
    front, a, b, client = fleet
    front.app.config.max_attempts = 1
    a.script.append(("status", b"429"))
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    status, headers, _ = await client.ask(body)  # streamed: the task path decides
    assert status == 429 and headers[b"x-gpufleet-plane"] == b"a"
    assert b.requests == 0


async def test_when_the_attempts_run_out_on_planes_out_of_rotation_the_answer_is_503(fleet):
    """Every plane out of rotation: they are tried anyway (last resort); when the bounded
    attempts all fail the client gets the documented 503 ``no_healthy_plane`` saying so,
    not a 502 — also when there are as many planes as attempts, or more."""
    front, a, b, client = fleet
    front.app.config.max_attempts = 2
    a.close()
    b.close()
    await until(lambda: a.closed >= 1)
    front.state.failed("a", "test: ejected")
    front.state.failed("b", "test: ejected")
    status, headers, body = await client.ask()
    error = json.loads(body)["error"]
    assert status == 503 and error["code"] == "no_healthy_plane", body
    assert "tried anyway" in error["message"]
    assert headers[b"content-type"].startswith(b"application/json")


async def test_a_stream_whose_plane_drops_after_done_ends_once_without_an_error(fleet):
    _front, a, b, client = fleet
    finish = {"choices": [{"index": 0, "delta": {"content": " hi"}, "finish_reason": None}]}
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (finish, stop))
    a.script.append(("sse_done_drop", events))
    status, _, body = await client.ask(
        {"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    assert status == 200
    assert body.count(b"data: [DONE]") == 1 and b"error" not in body
    assert b.requests == 0  # nothing was continued elsewhere


async def test_stream_is_read_as_the_engine_reads_it_and_other_values_are_refused(fleet):
    """vLLM takes "stream": "yes" or 1 for true: the gateway relays such a request as a
    stream (event by event, continuable), not as one JSON answer; 2 or [1] is a clear 400."""
    _front, a, _b, client = fleet
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    a.script.append(("sse_done_drop", b"data: " + json.dumps(done).encode() + b"\n\n"))
    user = [{"role": "user", "content": "x"}]
    status, headers, body = await client.ask({"model": "chat", "messages": user, "stream": "yes"})
    assert status == 200 and headers[b"content-type"].startswith(b"text/event-stream")
    assert body.count(b"data: [DONE]") == 1
    for bad in (2, [1], "maybe"):
        status, _, body = await client.ask({"model": "chat", "messages": user, "stream": bad})
        error = json.loads(body)["error"]
        assert (
            status == 400 and error["code"] == "invalid_stream" and "'stream'" in error["message"]
        )


async def test_asking_only_outside_the_deployments_jurisdictions_is_a_400_not_a_503(fleet):
    """No plane could ever serve it: a 503 would be retried by the OpenAI SDKs for nothing."""
    front, a, b, client = fleet
    table = front.state.table
    assert table is not None
    only_us = table.deployments[0].model_copy(update={"jurisdictions": ["US"]})
    again = table.model_copy(update={"generation": 2, "deployments": [only_us]})
    assert front.state.apply_table(again.model_dump_json().encode())
    client.send(extra=b"x-gpufleet-jurisdiction: DE\r\n")
    status, _, body = await client.answer()
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "jurisdiction_not_allowed"
    assert "only in US" in error["message"] and a.requests == b.requests + 1  # the warm-up only


async def test_a_health_probe_whose_body_stalls_closes_its_connection(fleet):
    """One connection leaked per probe while a plane sent a head and stalled its body."""
    from workloadplane.gateway.prober import PlaneProber

    front, _a, b, _client = fleet
    b.script.append(("head_stall", b""))
    await PlaneProber(front.state, timeout_s=0.2).probe(front.state.planes["b"])
    await until(lambda: b.closed == 1)


async def test_an_answer_delimited_by_the_planes_close_comes_whole(fleet):
    """A plane answering without a length (HTTP/1.0 style, the body ends at its close) was
    taken for a plane that broke mid-answer: a 502 for a whole answer."""
    _, a, _, client = fleet
    a.script.append(("until_close", b'{"whole": true}'))
    status, headers, body = await client.ask()
    assert status == 200 and body == b'{"whole": true}'
    assert headers[b"content-length"] == b"15"


async def test_a_fault_of_the_gateways_own_in_a_relay_answers_500_and_serving_goes_on(
    fleet, monkeypatch
):
    """An exception raised in a relay callback (a bug) escaped into the plane connection's
    parser, where nothing answered the client: it waited for good."""
    front, _, _, client = fleet
    calls = [0]
    route_header = front.app._route_header

    def broken(ranked):
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("injected fault")
        return route_header(ranked)

    monkeypatch.setattr(front.app, "_route_header", broken)
    status, _, body = await client.ask()
    assert status == 500
    assert json.loads(body)["error"]["code"] == "internal_error"
    assert "send it again" in json.loads(body)["error"]["message"]
    status, _, body = await client.ask()  # the same client connection goes on
    assert status == 200 and body == ANSWER and calls[0] == 2
