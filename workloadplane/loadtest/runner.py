"""Sends a load test's requests at their arrival times and records what each saw.

An OpenAI-compatible endpoint (a global gateway or a plane's router) over HTTP/1.1 with
keep-alive, through the router's own client (``UpstreamPool``). At most ``max_in_flight``
requests are open at once: a request due while the bound is reached is recorded as
``not_sent`` (never silently skipped: an overloaded server shows as such, not as a lighter
load). Only loopback and private addresses unless ``allow_remote`` (a load test is a
deliberate act against your own fleet).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from workloadplane.loadtest.profiles import LoadTestError, Plan, Request, arrivals, request
from workloadplane.loadtest.report import Outcome
from workloadplane.router.upstream import UpstreamError, UpstreamPool, host_port

MAX_IN_FLIGHT = 2048
MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""What one answer may hold in memory (4,096 tokens are far below it); a longer one
is cut and counted as ``answer over 4 MiB``: 2,048 open answers stay bounded."""


@dataclass(frozen=True)
class Progress:
    elapsed_s: float
    duration_s: float
    sent: int
    done: int
    failed: int
    in_flight: int


def target(url: str, allow_remote: bool) -> tuple[str, int]:
    """(host, port) of ``url``; refuses https (say so) and, unless ``allow_remote``, any
    address that is not loopback or private."""
    if url.startswith("https://"):
        raise LoadTestError("https is not supported: point --url at the gateway's http port")
    if not url.startswith("http://"):
        raise LoadTestError(f"--url must start with http:// (got {url!r})")
    host, port = host_port(url)
    if not allow_remote:
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, port)}
        except OSError as exc:
            raise LoadTestError(f"cannot resolve {host!r}: {exc}") from None
        for address in addresses:
            ip = ipaddress.ip_address(str(address).split("%")[0])
            if not (ip.is_loopback or ip.is_private):
                raise LoadTestError(
                    f"{host} ({ip}) is not a local or private address: pass --allow-remote "
                    "if you mean to load-test it"
                )
    return host, port


async def run(
    plan: Plan,
    host: str,
    port: int,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    timeout_s: float = 60.0,
    max_in_flight: int = MAX_IN_FLIGHT,
    on_progress: Callable[[Progress], None] | None = None,
    every_s: float = 0.5,
) -> list[Outcome]:
    """Run ``plan`` against ``host:port``; returns one outcome per planned request, in the
    order they were planned, once every answer is in."""
    times = arrivals(plan)
    pool = UpstreamPool(host, port, max_idle=max_in_flight)
    extra = [(b"content-type", b"application/json"), *(headers or [])]
    outcomes: list[Outcome | None] = [None] * len(times)
    open_now = 0
    start = time.monotonic()

    async def one(i: int, req: Request, at: float) -> None:
        nonlocal open_now
        try:
            outcomes[i] = await _send(pool, req, at, extra, timeout_s)
        finally:
            open_now -= 1

    def progress() -> Progress:
        done = [o for o in outcomes if o is not None]
        failed = sum(1 for o in done if o.kind == "normal" and not o.ok)
        elapsed = time.monotonic() - start
        return Progress(elapsed, plan.duration_s, len(done) + open_now, len(done), failed, open_now)

    async def report() -> None:
        while True:
            await asyncio.sleep(every_s)
            if on_progress is not None:
                on_progress(progress())

    reporter = asyncio.create_task(report())
    tasks: list[asyncio.Task[None]] = []
    try:
        for i, at in enumerate(times):
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            req = request(plan, i)
            if open_now >= max_in_flight:
                outcomes[i] = Outcome(at, "not_sent", req.stream, 0, False, math.inf, 0.0)
                continue
            open_now += 1  # counted when due, not when its task first runs
            tasks.append(asyncio.create_task(one(i, req, at)))
        await asyncio.gather(*tasks)
    finally:
        reporter.cancel()
        pool.close()
    if on_progress is not None:
        on_progress(progress())
    return [o for o in outcomes if o is not None]


async def _send(
    pool: UpstreamPool,
    req: Request,
    at: float,
    headers: list[tuple[bytes, bytes]],
    timeout_s: float,
) -> Outcome:
    t0 = time.monotonic()
    status, ttft, chunks, tokens, size = 0, math.inf, [], 0, 0
    try:
        async with asyncio.timeout(timeout_s):
            resp = await pool.request("POST", req.path, headers, req.body)
            status = resp.status
            if not req.stream or status != 200:
                body = bytearray()
                async for chunk in resp.body():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        resp.cut("the answer is over the load test's bound")
                        e2e = time.monotonic() - t0
                        return Outcome(
                            at,
                            req.kind,
                            req.stream,
                            status,
                            False,
                            e2e,
                            e2e,
                            0,
                            "answer over 4 MiB",
                        )
                resp.release()
                ttft = time.monotonic() - t0
                ok = status == 200 and b'"choices"' in body
                return Outcome(
                    at,
                    req.kind,
                    req.stream,
                    status,
                    ok,
                    ttft,
                    ttft,
                    _usage(body),
                    _error_of(status, body),
                )
            async for chunk in resp.body():
                if ttft == math.inf and _has_content(chunk):
                    ttft = time.monotonic() - t0
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    resp.cut("the answer is over the load test's bound")
                    e2e = time.monotonic() - t0
                    return Outcome(
                        at, req.kind, True, status, False, ttft, e2e, 0, "answer over 4 MiB"
                    )
                if req.kind == "client_goes_away":
                    resp.cut("the load test's client went away")
                    return Outcome(
                        at,
                        req.kind,
                        True,
                        status,
                        True,
                        ttft,
                        time.monotonic() - t0,
                        0,
                        "client went away",
                    )
            resp.release()
    except TimeoutError:
        return Outcome(
            at, req.kind, req.stream, status, False, ttft, time.monotonic() - t0, 0, "timed out"
        )
    except UpstreamError as exc:
        text = str(exc)
        what = "connection refused" if "refused" in text.lower() else text[:80]
        return Outcome(
            at, req.kind, req.stream, status, False, ttft, time.monotonic() - t0, 0, what
        )
    e2e = time.monotonic() - t0
    text = b"".join(chunks)
    done = b"data: [DONE]" in text
    errored = b'"error"' in text
    tokens = _stream_tokens(text)
    error = "error event" if errored else "" if done else "stream cut"
    return Outcome(at, req.kind, True, status, done and not errored, ttft, e2e, tokens, error)


def _has_content(chunk: bytes) -> bool:
    """Whether an SSE chunk carries a piece of the answer (not the role-only opener)."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                event = json.loads(line[6:])
            except ValueError:
                continue
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content") or choice.get("text"):
                    return True
    return False


def _usage(body: bytes | bytearray) -> int:
    try:
        usage = json.loads(body).get("usage") or {}
        return int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0


def _error_of(status: int, body: bytes | bytearray) -> str:
    """The OpenAI error ``code`` or ``type`` of a non-200 answer ("" for a 200)."""
    if status == 200:
        return ""
    try:
        error = json.loads(body).get("error") or {}
        code = str(error.get("code") or "")
        return (code if code and code != str(status) else str(error.get("type") or ""))[:60]
    except (ValueError, AttributeError):
        return ""


def _stream_tokens(text: bytes) -> int:
    """Output tokens of an SSE answer: its final usage, else its content chunks."""
    content = 0
    for line in text.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            continue
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens"):
            return int(usage["completion_tokens"])
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content += 1
    return content
