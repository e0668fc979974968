"""The router's HTTP/1.1 server and upstream client, on loopback sockets: one write per small
response, SSE heads out at once, pipelining in order, keep-alive reused, aborts (also of a
connect a silent host never answers)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from workloadplane.router.httpserver import HttpServer
from workloadplane.router.upstream import UpstreamAborted, UpstreamPool
from workloadplane.runtime.process import free_port


async def echo_app(scope, receive, send) -> None:
    """/stream: head, then two chunks 50 ms apart; /wait: answers when the client is gone;
    anything else: its method, path and body back, with a content-length."""
    message = await receive()
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        for part in (b"data: 1\n\n", b"data: [DONE]\n\n"):
            await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if scope["path"] == "/wait":
        assert (await receive())["type"] == "http.disconnect"
        DISCONNECTS.append(scope["path"])
        return
    body = f"{scope['method']} {scope['path']} ".encode() + message["body"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


DISCONNECTS: list[str] = []


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[int]:
    server = HttpServer(echo_app)
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        yield port
    finally:
        await server.close(grace_s=1)


async def exchange(port: int, raw: bytes, until: bytes) -> list[bytes]:
    """Send ``raw``; return the reads (one per arrival) until ``until`` has been seen."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    reads: list[bytes] = []
    async with asyncio.timeout(5):
        while until not in b"".join(reads):
            reads.append(await reader.read(65536))
    writer.close()
    return reads


async def test_small_response_is_one_write_with_its_head():
    async with serving() as port:
        reads = await exchange(port, b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi",
                               b"POST /x hi")  # fmt: skip
    assert len(reads) == 1
    assert reads[0].startswith(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")


async def test_stream_head_comes_before_its_chunks_and_ends_chunked():
    async with serving() as port:
        reads = await exchange(port, b"GET /stream HTTP/1.1\r\nhost: a\r\n\r\n", b"0\r\n\r\n")
    assert reads[0].endswith(b"transfer-encoding: chunked\r\n\r\n")  # alone, not held back
    assert b"".join(reads[1:]) == b"9\r\ndata: 1\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


async def test_pipelined_requests_answered_in_order():
    async with serving() as port:
        reads = await exchange(port, b"GET /stream HTTP/1.1\r\nhost: a\r\n\r\n"
                               b"POST /b HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\n\r\nz",
                               b"POST /b z")  # fmt: skip
    data = b"".join(reads)
    assert data.index(b"[DONE]") < data.index(b"POST /b z")


async def test_expect_100_continue_is_answered_once_the_connection_is_free():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nhost: a\r\n\r\n"
                     b"POST /b HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\n"
                     b"content-length: 1\r\n\r\n")  # fmt: skip
        async with asyncio.timeout(5):
            data = await reader.readuntil(b"100 Continue\r\n\r\n")
            assert b"[DONE]" in data  # not before the response ahead of it
            writer.write(b"z")
            assert (await reader.readuntil(b"POST /b z")).startswith(b"HTTP/1.1 200 OK")
        writer.close()


async def test_http10_closes_and_garbage_gets_400():
    async with serving() as port:
        reads = await exchange(port, b"GET /a HTTP/1.0\r\n\r\n", b"GET /a")
        assert b"connection: close\r\n" in reads[0]
        reads = await exchange(port, b"NOT HTTP\r\n\r\n", b"bad request")
    assert reads[0].startswith(b"HTTP/1.1 400 ")


async def test_receive_reports_the_client_gone():
    DISCONNECTS.clear()
    async with serving() as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /wait HTTP/1.1\r\nhost: a\r\n\r\n")
        await asyncio.sleep(0.05)
        writer.close()
        async with asyncio.timeout(2):
            while not DISCONNECTS:
                await asyncio.sleep(0.01)


async def test_upstream_keeps_its_connection_alive():
    async with serving() as port:
        pool = UpstreamPool("127.0.0.1", port)
        for i in range(3):
            resp = await pool.request("POST", "/p", body=b"%d" % i)
            assert await resp.read() == b"POST /p %d" % i
            resp.release()
        pool.close()
    assert pool.connections_opened == 1


async def test_a_late_cut_of_a_released_answer_leaves_the_pooled_connection_alone():
    """The gateway cut the answer a stream's client had been reading when that client left,
    though the answer was released and its connection back in the pool: the request using
    the connection then broke."""
    async with serving() as port:
        pool = UpstreamPool("127.0.0.1", port)
        first = await pool.request("POST", "/p", body=b"1")
        assert await first.read() == b"POST /p 1"
        first.release()
        second = await pool.request("POST", "/stream")  # on the same connection
        first.cut("the client left")
        assert await second.read() == b"data: 1\n\ndata: [DONE]\n\n"
        second.release()
        pool.close()
    assert pool.connections_opened == 1


async def test_abort_fails_the_exchange_even_while_connecting():
    """A hung replica: the connection is accepted (backlog) but nothing answers."""
    hung = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = hung.sockets[0].getsockname()[1]
    pool = UpstreamPool("127.0.0.1", port)
    aborts: list = []
    for when in ("connecting", "waiting"):
        request = asyncio.ensure_future(pool.request("POST", "/x", body=b"{}",
                                                     on_abortable=aborts.append))  # fmt: skip
        await asyncio.sleep(0) if when == "connecting" else await asyncio.sleep(0.05)
        aborts[-1](f"ejected while {when}")
        with pytest.raises(UpstreamAborted, match=when):
            await request
    with pytest.raises(UpstreamAborted, match="no response within"):
        await pool.request("POST", "/x", body=b"{}", head_timeout=0.05)
    pool.close()
    hung.close()


async def test_abort_ends_a_connect_that_a_silent_host_never_answers():
    """A cut network loses the SYN (here the kernel drops it: the listener's accept queue
    is full), so the connect would last its whole timeout; an abort ends it at once. A
    caller cancelled while connecting is cancelled, not aborted."""
    silent = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = silent.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port))  # fills the accept queue
    pool = UpstreamPool("127.0.0.1", port)
    aborts: list = []
    request = asyncio.ensure_future(pool.request("POST", "/x", body=b"{}", connect_timeout=10,
                                                 on_abortable=aborts.append))  # fmt: skip
    await asyncio.sleep(0.05)
    aborts[-1]("ejected while connecting")
    async with asyncio.timeout(1):
        with pytest.raises(UpstreamAborted, match="connecting"):
            await request
    cancelled = asyncio.ensure_future(pool.request("GET", "/x", connect_timeout=10))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    pool.close()
    queued.close()
    silent.close()


async def test_an_upgrade_request_is_answered_in_http11_then_closed():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /a HTTP/1.1\r\nhost: a\r\nconnection: Upgrade, HTTP2-Settings\r\n"
                     b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")  # fmt: skip
        async with asyncio.timeout(5):
            data = await reader.read()  # to EOF: closed after the response
        writer.close()
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"GET /a ")


async def test_a_short_answer_relayed_whole_goes_out_in_one_write_and_keeps_its_connection():
    """A front relaying an answer whose body came with its head sends head and body in one
    write, records it whole, and gives the upstream connection back for the next request."""
    from workloadplane.router.front import ClientWatch, relay

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()
        return {}

    async with serving() as port:
        pool = UpstreamPool("127.0.0.1", port)
        for i in range(2):
            resp = await pool.request("POST", "/p", body=b"%d" % i)
            await asyncio.sleep(0.05)  # the body is in by now
            sent.clear()
            relayed = await relay(resp, False, send, ClientWatch(receive), [(b"x-a", b"1")], "t")
            assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
            assert sent[1] == {"type": "http.response.body", "body": b"POST /p %d" % i,
                               "more_body": False}  # fmt: skip
            assert (b"x-a", b"1") in sent[0]["headers"]  # type: ignore[operator]
            assert relayed.complete and relayed.size == 9 and relayed.first > 0
            assert relayed.tail == b"POST /p %d" % i
        pool.close()
    assert pool.connections_opened == 1


async def test_a_client_that_reads_nothing_of_a_long_answer_is_cut_off():
    """With its side full, a client that never read held the exchange (and, at the gateway
    or router, its upstream connection and the engine's work) for good."""
    from workloadplane.router.httpserver import Limits

    ended: list[str] = []

    async def flood(scope, receive, send) -> None:
        await receive()
        gone = asyncio.ensure_future(receive())  # as the router's ClientWatch does
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            for _ in range(10_000):  # 640 MB: far more than the sockets hold
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
                if gone.done():
                    break
        finally:
            ended.append("flood")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    server = HttpServer(flood, limits=Limits(write_stall_s=0.3))
    port = free_port()
    await server.start("127.0.0.1", port)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")  # and never reads
        async with asyncio.timeout(10):
            while not ended:
                await asyncio.sleep(0.02)
        assert not server.connections  # cut off
    finally:
        sock.close()
        await server.close(grace_s=1)


@contextlib.asynccontextmanager
async def raw_upstream(
    body: bytes, raw: bytes | None = None
) -> AsyncIterator[tuple[int, list[asyncio.Transport]]]:
    """A replica that answers any request with ``body`` in one write (or with ``raw`` as it
    is), and its transport, to see how much of it is still waiting to leave."""
    transports: list[asyncio.Transport] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        transports.append(writer.transport)  # type: ignore[arg-type]
        head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body)
        writer.write(raw if raw is not None else head + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], transports
    finally:
        server.close()


async def test_a_slow_reader_holds_at_most_the_high_water_of_a_long_body():
    """On the task path a reader that takes a long body slowly (its client slower than the
    replica) held all of it in memory: the connection stops reading from the replica once
    HIGH_WATER bytes wait, and the body still arrives whole."""
    from workloadplane.router.upstream import HIGH_WATER

    body = bytes(range(256)) * (256 * 1024)  # 64 MiB
    async with raw_upstream(body) as (port, transports):
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/big")
        conn = resp._conn
        left = [-1, -2]  # bytes still waiting at the replica, at the last two looks
        async with asyncio.timeout(10):
            while left[-1] != left[-2] or left[-1] < 0:  # until the replica stalls
                await asyncio.sleep(0.05)
                left.append(transports[0].get_write_buffer_size())
        assert conn._held <= HIGH_WATER + 256 * 1024
        assert left[-1] > len(body) // 2  # the replica waits: the bytes stayed with it
        got = bytearray()
        async for chunk in resp.body():
            got += chunk
        assert got == body
        resp.release()
        pool.close()


async def test_the_idle_deadline_counts_the_replica_silent_not_our_own_pause():
    """A stream's idle deadline cuts a replica that stops sending; a reader that takes a
    long body slowly (the connection stopped reading: back-pressure) is not that."""
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB, over the high water
    async with raw_upstream(body) as (port, _):
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/big")
        resp.watch_idle(0.2)
        await asyncio.sleep(0.5)  # the reader is slow: reading is paused meanwhile
        got = bytearray()
        async for chunk in resp.body():
            got += chunk
        assert got == body
        resp.release()
        pool.close()


async def test_read_of_an_answer_over_its_limit_fails_and_drops_the_connection():
    from workloadplane.router.upstream import UpstreamError

    async with raw_upstream(b"x" * 5000) as (port, _):
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/metrics")
        with pytest.raises(UpstreamError, match="over 4096 bytes"):
            await resp.read(limit=4096)
        resp.release()
        assert resp._conn.closed  # not given back half read
        resp = await pool.request("GET", "/metrics")
        assert await resp.read(limit=5000) == b"x" * 5000
        resp.release()
        pool.close()


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nx-a: " + b"a" * (8 << 20), "head over 65536 bytes"),
        (b"HTTP/1.1 200 OK\r\n" + b"x-a: 1\r\n" * 200 + b"\r\n", "more than 100 headers"),
    ],
    ids=["endless-header", "too-many-headers"],
)
async def test_an_upstream_head_without_bounds_fails_as_a_bad_response(raw: bytes, why: str):
    from workloadplane.router.upstream import UpstreamError

    async with raw_upstream(b"", raw=raw) as (port, _):
        pool = UpstreamPool("127.0.0.1", port)
        with pytest.raises(UpstreamError, match=why):
            await pool.request("GET", "/x", head_timeout=10)
        pool.close()


@contextlib.asynccontextmanager
async def scripted_upstream(answers: list[bytes]) -> AsyncIterator[int]:
    """A replica answering the n-th request it gets (on any connection) with ``answers[n]``
    as it is (and ``answers[-1]`` after the list ends)."""
    served = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answers[min(served[0], len(answers) - 1)])
                served[0] += 1
                await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_bytes_after_an_answer_never_answer_the_next_request():
    """An upstream that sent a second message after its answer (or a trailer claiming a
    content-length) had it parsed into the answer, or handed to the next request on the
    kept-alive connection: another client's answer."""
    smuggled = (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nevil!\r\n0\r\n\r\n")  # fmt: skip
    clean = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nclean"
    async with scripted_upstream([smuggled, clean]) as port:
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/a")
        assert await resp.read() == b"ok"
        resp.release()
        resp = await pool.request("GET", "/b")
        assert await resp.read() == b"clean"
        resp.release()
        pool.close()
    assert pool.connections_opened == 2  # the first connection was not reused


async def test_a_trailer_is_never_a_header_of_the_answer():
    chunked = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
               b"x-request-id: forged\r\n\r\n")  # fmt: skip
    async with scripted_upstream([chunked]) as port:
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/a")
        assert await resp.read() == b"ok"
        assert resp.headers == [(b"transfer-encoding", b"chunked")]
        resp.release()
        pool.close()


async def test_an_interim_answer_is_skipped_and_the_final_one_is_the_answer():
    """A 103 Early Hints was taken for the answer; its real answer then went to the next
    request on the connection."""
    first = (b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
             b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal")  # fmt: skip
    second = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond"
    async with scripted_upstream([first, second]) as port:
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/a")
        assert resp.status == 200 and await resp.read() == b"final"
        assert (b"link", b"</a>") not in resp.headers
        resp.release()
        resp = await pool.request("GET", "/b")
        assert await resp.read() == b"second"
        resp.release()
        pool.close()
    assert pool.connections_opened == 1


async def test_a_request_trailer_is_never_a_header_of_the_request():
    """A chunked request's trailer (``x-request-id``, an Authorization) was appended to the
    request's headers, after any front proxy had checked them."""

    async def headers_back(scope, receive, send) -> None:
        await receive()
        body = b";".join(b"%s=%s" % pair for pair in scope["headers"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})  # fmt: skip
        await send({"type": "http.response.body", "body": body, "more_body": False})

    server = HttpServer(headers_back)
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        raw = (b"POST /x HTTP/1.1\r\nhost: a\r\nx-request-id: head\r\ntransfer-encoding: chunked"
               b"\r\n\r\n2\r\nhi\r\n0\r\nx-request-id: trailer\r\nauthorization: Bearer B\r\n\r\n")  # fmt: skip
        reads = await exchange(port, raw, b"x-request-id=head")
    finally:
        await server.close(grace_s=1)
    answer = b"".join(reads)
    assert b"trailer" not in answer and b"authorization" not in answer


async def test_a_metrics_answer_that_stalls_does_not_leak_its_connection():
    """The scrape of a replica whose /metrics body stalled timed out and left the connection
    open (one socket, and what it held, per scrape)."""
    from types import SimpleNamespace

    from workloadplane.router.app import _fetch_metrics

    closed = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nvllm:")
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # b"" once the router closes its side
        closed.set()

    server = await asyncio.start_server(stall, "127.0.0.1", 0)
    pool = UpstreamPool("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        assert await _fetch_metrics(SimpleNamespace(pool=pool)) == ""  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            await closed.wait()
    finally:
        pool.close()
        server.close()


async def test_a_request_trickled_in_is_answered_408_and_closed():
    """A client sending a byte now and then kept its connection (and what it had sent)
    for good: the idle sweep saw it active."""
    from workloadplane.router.httpserver import Limits

    server = HttpServer(echo_app, keep_alive_s=5, limits=Limits(read_request_s=0.3))
    port = free_port()
    await server.start("127.0.0.1", port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\nab")
        answer = b""
        async with asyncio.timeout(5):
            while not reader.at_eof():
                writer.write(b"c")  # a byte at a time, never the whole body
                with contextlib.suppress(TimeoutError):
                    answer += await asyncio.wait_for(reader.read(1024), 0.05)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout")
    finally:
        writer.close()
        await server.close(grace_s=1)


async def test_connections_beyond_the_limit_are_turned_away():
    from workloadplane.router.httpserver import Limits

    server = HttpServer(echo_app, limits=Limits(max_connections=2))
    port = free_port()
    await server.start("127.0.0.1", port)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(5):
            assert (await reader.read()).startswith(b"HTTP/1.1 503 Service Unavailable")
        writer.close()
        _, first = held[0]
        first.write(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n")  # the held ones are served
        async with asyncio.timeout(5):
            assert (await held[0][0].readuntil(b"GET /x ")).startswith(b"HTTP/1.1 200")
    finally:
        for _, w in held:
            w.close()
        await server.close(grace_s=1)


async def test_an_http10_client_gets_a_stream_unchunked_and_ended_by_the_close():
    """nginx speaks HTTP/1.0 to its upstreams by default: chunk-size lines leaked into the
    events it passed on."""
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.0\r\nhost: a\r\n\r\n")
        async with asyncio.timeout(5):
            answer = await reader.read(-1)  # to the close
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower()
    assert body == b"data: 1\n\ndata: [DONE]\n\n"


async def test_garbage_after_a_request_being_answered_waits_for_its_answer():
    """Bytes that are no request, pipelined after one being answered, had the 400 written
    and the connection closed at once: the answer was lost (or the 400 spliced into a
    stream)."""
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nhost: a\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
        async with asyncio.timeout(5):
            answer = await reader.read(-1)
        writer.close()
    stream, _, rest = answer.partition(b"0\r\n\r\n")
    assert stream.startswith(b"HTTP/1.1 200 OK") and b"data: [DONE]" in stream
    assert rest.startswith(b"HTTP/1.1 400 Bad Request")


async def test_an_http10_request_with_transfer_encoding_is_answered_then_closed():
    """RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has framing a proxy in
    front may read otherwise: it was kept alive, the next bytes read as a new request."""
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.0\r\nconnection: keep-alive\r\ntransfer-encoding: chunked"
                     b"\r\n\r\n2\r\nhi\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n")  # fmt: skip
        async with asyncio.timeout(5):
            answer = await reader.read(-1)
        writer.close()
    assert b"POST /x hi" in answer and b"smuggled" not in answer


@contextlib.asynccontextmanager
async def closing_upstream(raw: bytes, *, reset: bool = False) -> AsyncIterator[int]:
    """A replica that answers one request with ``raw`` and then closes its connection (or
    resets it: ``reset``)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw)
        await writer.drain()
        if reset:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


UNTIL_CLOSE = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it"


async def test_a_body_that_ends_with_the_connection_is_whole():
    """An answer with neither a length nor chunks (HTTP/1.0 style) ends when the upstream
    closes: it was read as cut (an UpstreamError, a 502 at the front)."""
    async with closing_upstream(UNTIL_CLOSE) as port:
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/a")
        assert resp.status == 200 and await resp.read() == b"all of it"
        resp.release()
        pool.close()


async def test_a_body_that_ends_with_the_connection_reaches_a_listener_whole():
    from workloadplane.router.upstream import Connection

    async with closing_upstream(UNTIL_CLOSE) as port:
        pool = UpstreamPool("127.0.0.1", port)
        conn = Connection()
        await conn.connect("127.0.0.1", port, 5)
        ended: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        chunks: list[bytes] = []

        class Collect:
            def on_head(self, status, headers) -> None:
                assert status == 200

            def on_chunk(self, chunk: bytes) -> None:
                chunks.append(chunk)

            def on_read(self) -> None:
                pass

            def on_end(self) -> None:
                ended.set_result(b"".join(chunks))

            def on_error(self, exc) -> None:
                ended.set_exception(exc)

        conn.relay(pool.encode("GET", "/a", [], b""), Collect())
        assert await asyncio.wait_for(ended, 5) == b"all of it"
        assert not conn.reusable
        pool.close()


async def test_a_reset_during_a_body_without_length_is_still_a_cut():
    """Only a clean close ends such a body: a reset may have cut it."""
    from workloadplane.router.upstream import UpstreamError

    async with closing_upstream(UNTIL_CLOSE, reset=True) as port:
        pool = UpstreamPool("127.0.0.1", port)
        resp = await pool.request("GET", "/a")
        with pytest.raises(UpstreamError):
            await resp.read()
        resp.release()
        pool.close()
