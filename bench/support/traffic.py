"""Open-loop OpenAI traffic for the failover bench, and what each request saw.

``open_loop`` starts request i at ``i / rate`` seconds whatever the answers do (a failing
front does not slow the load down), every other request streaming. Per request: success, a
cut stream (an SSE answer that ended without ``[DONE]`` and without an error event), time to
first token (the first SSE data chunk; for a plain answer its head), end-to-end time and the
plane that served it (``x-gpufleet-plane``). :func:`summarise` and the other functions are
pure, on those records.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from workloadplane.loadtest.report import percentile
from workloadplane.router.upstream import UpstreamError, UpstreamPool

Headers = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Outcome:
    start: float  # time.monotonic() when the request was sent
    stream: bool
    status: int  # 0: no answer (connection failed, timed out)
    ok: bool
    cut: bool  # a 200 stream that ended with neither [DONE] nor an error event
    ttft: float  # seconds to the first token (inf: none came)
    e2e: float  # seconds to the end of the answer (or to the failure)
    plane: str  # x-gpufleet-plane, "" when absent
    error: str = ""
    route: str = ""  # x-gpufleet-route: why the gateway sent it there


def body(stream: bool, max_tokens: int) -> bytes:
    payload: dict[str, object] = {
        "model": "chat",
        "messages": [{"role": "user", "content": "Say something about failover."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if stream:
        payload["stream"] = True
    return json.dumps(payload).encode()


def classify_stream(status: int, text: bytes) -> tuple[bool, bool]:
    """(ok, cut) of an SSE answer's whole body."""
    if status != 200:
        return False, False
    done = b"data: [DONE]" in text
    errored = b'"error"' in text
    return done and not errored, not done and not errored


async def one_request(
    pool: UpstreamPool, stream: bool, max_tokens: int, headers: Headers, timeout: float
) -> Outcome:
    t0 = time.monotonic()
    status, plane, route, ttft = 0, "", "", math.inf
    chunks: list[bytes] = []
    try:
        async with asyncio.timeout(timeout):
            resp = await pool.request(
                "POST",
                "/v1/chat/completions",
                [(b"content-type", b"application/json"), *headers],
                body(stream, max_tokens),
            )
            status = resp.status
            head = dict(resp.headers)
            plane = head.get(b"x-gpufleet-plane", b"").decode()
            route = head.get(b"x-gpufleet-route", b"").decode()
            if not stream:
                ttft = time.monotonic() - t0
            async for chunk in resp.body():
                if stream and ttft == math.inf and b"data: " in chunk:
                    ttft = time.monotonic() - t0
                chunks.append(chunk)
            resp.release()
    except (UpstreamError, TimeoutError) as exc:
        e2e = time.monotonic() - t0
        text = b"".join(chunks)
        cut = stream and status == 200 and b"data: [DONE]" not in text and b'"error"' not in text
        return Outcome(t0, stream, status, False, cut, ttft, e2e, plane, type(exc).__name__, route)
    e2e = time.monotonic() - t0
    text = b"".join(chunks)
    if stream:
        ok, cut = classify_stream(status, text)
    else:
        ok, cut = status == 200 and b'"choices"' in text, False
    return Outcome(t0, stream, status, ok, cut, ttft, e2e, plane, route=route)


async def open_loop(
    port: int,
    rate: float,
    seconds: float,
    *,
    max_tokens: int = 16,
    headers: Headers = (),
    timeout: float = 30.0,
) -> list[Outcome]:
    """``rate`` requests a second for ``seconds`` to ``127.0.0.1:port``, half streaming;
    returns once every answer is in."""
    pool = UpstreamPool("127.0.0.1", port, max_idle=1024)
    tasks: list[asyncio.Task[Outcome]] = []
    t0 = time.monotonic()
    n = int(rate * seconds)
    try:
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(one_request(pool, i % 2 == 1, max_tokens, headers, timeout))
            )
        return list(await asyncio.gather(*tasks))
    finally:
        pool.close()


# --- pure summaries --------------------------------------------------------------------------


def failed(outcomes: Sequence[Outcome]) -> int:
    """Requests that did not succeed (cut streams included)."""
    return sum(1 for o in outcomes if not o.ok)


def cut(outcomes: Sequence[Outcome]) -> int:
    return sum(1 for o in outcomes if o.cut)


def failures(outcomes: Sequence[Outcome]) -> str:
    """What the failed requests got, most frequent first: ``3 x 502, 1 x 200 error event``."""
    kinds: dict[str, int] = {}
    for o in outcomes:
        if o.ok:
            continue
        what = o.error or ("stream cut" if o.cut else "error event" if o.stream else "bad body")
        key = f"{o.status} {what}" if o.status else what
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))


def served_by(outcomes: Sequence[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        if o.ok:
            out[o.plane] = out.get(o.plane, 0) + 1
    return out


def busiest(outcomes: Sequence[Outcome]) -> str:
    """The plane that served the most requests (the one to kill)."""
    counts = served_by(outcomes)
    return max(counts, key=lambda k: counts[k]) if counts else ""


def window(outcomes: Sequence[Outcome], start: float, end: float) -> list[Outcome]:
    return [o for o in outcomes if start <= o.start < end]


def p99_e2e(outcomes: Sequence[Outcome]) -> float:
    """p99 end-to-end, a failure counted at the time it took to fail."""
    return percentile([o.e2e for o in outcomes], 99)


def p99_ttft(outcomes: Sequence[Outcome]) -> float:
    return percentile([o.ttft for o in outcomes], 99)


def in_flight_at(outcomes: Sequence[Outcome], plane: str, at: float) -> int:
    """Requests answered by ``plane`` that were in flight at ``at`` (the client's view)."""
    return sum(1 for o in outcomes if o.plane == plane and o.start <= at < o.start + o.e2e)


def sent_far_with_headroom(
    outcomes: Sequence[Outcome], far: str, near: str, near_capacity: int, since: float = 0.0
) -> int:
    """Requests started from ``since`` on and served by ``far`` while ``near`` had at
    least two free slots (as the client counts its own requests there): spill-over that
    was not needed."""
    return sum(
        1
        for o in outcomes
        if o.plane == far
        and o.start >= since
        and in_flight_at(outcomes, near, o.start) <= near_capacity - 2
    )
