"""A delaying TCP proxy: the network between a front (gateway, HAProxy) and one plane.

``tc netem`` is not available on this kernel, so each plane gets a proxy that holds every
chunk for the plane's one-way latency in each direction (order kept), so that whoever sends
through it measures the round trip itself. A new connection also pays the TCP handshake: its
first bytes leave no earlier than one round trip after the accept. When the plane is down
(its port refuses) the client's connection is reset one round trip after the accept, as the
plane host's RST would come back. Every request start seen on the way in (a chunk that
begins with ``POST ``) is reported with the proxy's name and its ``time.monotonic()`` (one
clock for every process of this machine): what "no new request goes to the dead plane" is
measured from.

``python bench/support/delay_proxy.py --route NAME=LISTEN:UPSTREAM:DELAY_MS …`` runs several
proxies in one process (apart from the load generator's): it prints ``ready`` once every one
listens, then ``req NAME TIME`` per request start and ``conn NAME TIME`` per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

OnRequest = Callable[[str, float], None]


@dataclass(frozen=True)
class Route:
    name: str
    listen: int
    upstream: int
    delay_s: float

    @classmethod
    def parse(cls, text: str) -> Route:
        """``NAME=LISTEN:UPSTREAM:DELAY_MS``, e.g. ``near=9001:8001:2``."""
        name, sep, rest = text.partition("=")
        parts = rest.split(":")
        try:
            if not sep or not name or len(parts) != 3:
                raise ValueError("not three fields")
            return cls(name, int(parts[0]), int(parts[1]), float(parts[2]) / 1000)
        except ValueError:
            raise ValueError(
                f"route {text!r}: write NAME=LISTEN_PORT:UPSTREAM_PORT:DELAY_MS"
            ) from None


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a host answers a connection to a closed port."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class DelayProxy:
    """Listens on ``127.0.0.1:listen`` and forwards to ``upstream_host:upstream``."""

    def __init__(
        self,
        route: Route,
        *,
        upstream_host: str = "127.0.0.1",
        on_request: OnRequest | None = None,
        on_connection: OnRequest | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.route, self.upstream_host = route, upstream_host
        self.on_request, self.on_connection, self.clock = on_request, on_connection, clock
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        """Connections accepted so far."""

    async def start(self, host: str = "127.0.0.1") -> int:
        """Listen; returns the port (``route.listen``, or a free one when that is 0)."""
        self._server = await asyncio.start_server(self._handle, host, self.route.listen)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        accepted, delay = self.clock(), self.route.delay_s
        self.connections += 1
        if self.on_connection is not None:
            self.on_connection(self.route.name, accepted)
        self._writers.add(cwriter)
        try:
            try:
                ureader, uwriter = await asyncio.open_connection(
                    self.upstream_host, self.route.upstream
                )
            except OSError:
                # a dead host resets the connection one round trip after the SYN; a client
                # that wrote its request meanwhile sent it toward this plane all the same
                # (a request start, for "no new request goes to the dead plane")
                with contextlib.suppress(TimeoutError, ConnectionError, OSError):
                    async with asyncio.timeout(max(0.0, accepted + 2 * delay - self.clock())):
                        first = await creader.read(65536)
                        if first.startswith(b"POST ") and self.on_request is not None:
                            self.on_request(self.route.name, accepted)
                        await asyncio.sleep(max(0.0, accepted + 2 * delay - self.clock()))
                _reset(cwriter)
                return
            self._writers.add(uwriter)
            try:
                await asyncio.gather(
                    self._pipe(creader, uwriter, cwriter, accepted + 2 * delay, inbound=True),
                    self._pipe(ureader, cwriter, uwriter, 0.0, inbound=False),
                )
            finally:
                self._writers.discard(uwriter)
        finally:
            self._writers.discard(cwriter)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
        not_before: float,
        *,
        inbound: bool,
    ) -> None:
        """Copy ``reader`` to ``writer``, each chunk written ``delay`` after it arrived (and
        not before ``not_before``); EOF or a reset closes both sides, also after the delay."""
        loop = asyncio.get_running_loop()
        delay, due = self.route.delay_s, 0.0
        # loop.call_at runs on loop.time(); both are CLOCK_MONOTONIC but keep the offset
        offset = loop.time() - self.clock()
        while True:
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                data = b""
            now = self.clock()
            # strictly later than the previous chunk: timers due at the same instant may run
            # in any order
            due = max(due + 1e-6, max(now, not_before) + delay)
            if not data:
                loop.call_at(due + offset, _close_both, writer, other)
                return
            if inbound and self.on_request is not None and data.startswith(b"POST "):
                self.on_request(self.route.name, now)
            loop.call_at(due + offset, _write, writer, data)


def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.is_closing():
        writer.write(data)


def _close_both(a: asyncio.StreamWriter, b: asyncio.StreamWriter) -> None:
    for w in (a, b):
        if not w.is_closing():
            w.close()


async def _serve(routes: list[Route]) -> None:
    def report(name: str, at: float) -> None:
        sys.stdout.write(f"req {name} {at:.6f}\n")
        sys.stdout.flush()

    def accepted(name: str, at: float) -> None:
        sys.stdout.write(f"conn {name} {at:.6f}\n")
        sys.stdout.flush()

    proxies = [DelayProxy(r, on_request=report, on_connection=accepted) for r in routes]
    for p in proxies:
        await p.start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for p in proxies:
            await p.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--route", action="append", type=Route.parse, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.route))


if __name__ == "__main__":
    main()
