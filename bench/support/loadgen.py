"""A small keep-alive HTTP/1.1 load generator on asyncio streams (no client library overhead).

`run(host, port, make_request, connections, seconds)` returns completed requests, errors and
latencies; `make_request(i)` gives the raw request bytes for the i-th request of a connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def http_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: bench"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    if length:
        await reader.readexactly(length)
    return status


async def _worker(
    host: str, port: int, make: Callable[[int], bytes], stop_at: float, result: LoadResult, wid: int
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = wid * 1_000_000
    try:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            writer.write(make(i))
            status = await _read_response(reader)
            i += 1
            if 200 <= status < 300:
                result.ok += 1
                result.latencies.append(time.perf_counter() - started)
            else:
                result.errors += 1
    finally:
        writer.close()


async def _run(
    host: str, port: int, make: Callable[[int], bytes], connections: int, seconds: float
) -> LoadResult:
    result = LoadResult()
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(
        *(_worker(host, port, make, stop_at, result, w) for w in range(connections))
    )
    result.seconds = time.perf_counter() - started
    return result


def run(
    host: str, port: int, make: Callable[[int], bytes], connections: int = 16, seconds: float = 5.0
) -> LoadResult:
    return asyncio.run(_run(host, port, make, connections, seconds))
