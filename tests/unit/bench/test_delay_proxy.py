"""The failover bench's delay proxy on loopback: it holds each chunk one way's delay in each
direction, keeps order, charges a new connection its handshake, resets a connection to a
plane that is down one round trip later, and reports every request start."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from bench.support.delay_proxy import DelayProxy, Route

DELAY = 0.05


async def echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> float:
    t0 = time.monotonic()
    writer.write(data)
    got = await asyncio.wait_for(reader.readexactly(len(data)), 5)
    assert got == data
    return time.monotonic() - t0


async def test_each_way_is_delayed_and_a_new_connection_pays_its_handshake() -> None:
    server, upstream = await echo_server()
    proxy = DelayProxy(Route("p", 0, upstream, DELAY))
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        first = await exchange(reader, writer, b"POST / HTTP/1.1\r\n\r\n")
        again = await exchange(reader, writer, b"POST / HTTP/1.1\r\n\r\n")
        writer.close()
    finally:
        await proxy.close()
        server.close()
    # the handshake's round trip, then the request's (the accept may come a hair after t0)
    assert first >= 4 * DELAY - 0.002
    assert 2 * DELAY <= again < 4 * DELAY + 0.5  # keep-alive: one round trip
    assert proxy.connections == 1


async def test_chunks_keep_their_order() -> None:
    server, upstream = await echo_server()
    proxy = DelayProxy(Route("p", 0, upstream, 0.005))
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = b""
        for i in range(200):
            chunk = f"chunk-{i};".encode()
            writer.write(chunk)
            sent += chunk
            if i % 10 == 0:
                await asyncio.sleep(0.001)
        got = await asyncio.wait_for(reader.readexactly(len(sent)), 5)
        writer.close()
    finally:
        await proxy.close()
        server.close()
    assert got == sent


async def test_a_plane_that_is_down_resets_the_connection_after_a_round_trip() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
    seen: list[str] = []
    proxy = DelayProxy(
        Route("p", 0, closed.getsockname()[1], DELAY), on_request=lambda n, t: seen.append(n)
    )
    port = await proxy.start()
    try:
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\n\r\n")
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        elapsed = time.monotonic() - t0
    finally:
        await proxy.close()
        closed.close()
    assert elapsed >= 2 * DELAY
    # a request sent toward a dead plane counts: the bench's "no new request goes to the
    # dead plane" read ~0 s for a killed plane whatever a front did before
    assert seen == ["p"]


async def test_request_starts_are_reported_with_the_plane_name() -> None:
    server, upstream = await echo_server()
    seen: list[tuple[str, float]] = []
    proxy = DelayProxy(Route("near", 0, upstream, 0.0), on_request=lambda n, t: seen.append((n, t)))
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await exchange(reader, writer, b"GET /health HTTP/1.1\r\n\r\n")
        before = time.monotonic()
        await exchange(reader, writer, b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
        writer.close()
    finally:
        await proxy.close()
        server.close()
    assert [n for n, _ in seen] == ["near"]  # the health check is not a request
    assert seen[0][1] >= before


def test_routes_parse_and_bad_ones_say_how_to_write_them() -> None:
    assert Route.parse("near=9001:8001:2.5") == Route("near", 9001, 8001, 0.0025)
    for bad in ("near", "near=9001:8001", "=1:2:3", "near=a:b:c"):
        with pytest.raises(ValueError, match="NAME=LISTEN_PORT:UPSTREAM_PORT:DELAY_MS"):
            Route.parse(bad)
