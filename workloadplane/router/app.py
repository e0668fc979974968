"""The router's ASGI app: OpenAI-compatible routes in front of a plane's replicas.

Raw ASGI (no framework) because every microsecond here is added latency. Per request: read
the body, parse only ``model``, ``stream``, ``stream_options``, the prompt prefix and the
adapter; authenticate and pick a tier; take a replica slot (queueing if needed); forward the
body untouched; stream the response back as it arrives. Nothing of a prompt or completion
is ever logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from workloadplane.router import errors
from workloadplane.router.core import (
    Backend,
    NoCapacityError,
    QueueFullError,
    QueueTimeoutError,
    Router,
    Ticket,
)
from workloadplane.router.dispatch import ClientGoneError, Dispatcher, Forward
from workloadplane.router.metrics import RouterMetrics, relabel_vllm, render_families
from workloadplane.router.upstream import Response, UpstreamError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

INFERENCE_PATHS = {b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"}
_DROP_REQUEST = {
    b"host",
    b"content-length",
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"authorization",
    b"te",
    b"upgrade",
    b"expect",
    b"x-priority",
}
_DROP_RESPONSE = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"date",
    b"server",
    b"x-request-id",
}
_TIERS = {"high": 0, "normal": 1, "low": 2}
_USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')
_random_bits = random.getrandbits
_FLUSH = {"type": "http.response.body", "body": b"", "more_body": True}


class RouterApp:
    """HTTP only: parse the request, authenticate, hand it to the dispatcher, stream the
    answer back, and turn the dispatcher's typed errors into OpenAI-shaped ones."""

    def __init__(self, router: Router, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self.router = router
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.config = router.config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"].encode() if isinstance(scope["path"], str) else scope["path"]
        method = scope["method"]
        if method == "POST" and path in INFERENCE_PATHS:
            await self.inference(scope, receive, send, path)
        elif method == "GET" and path == b"/v1/models":
            await self.models(send)
        elif method == "GET" and path == b"/metrics":
            await self.scrape(send)
        elif method == "GET" and path == b"/health":
            await _respond(send, 200, b"", b"text/plain")
        elif method == "GET" and path == b"/internal/load":
            await _respond(send, 200, json.dumps(self.router.load_report()).encode())
        else:
            message = (
                f"no route {method} {path.decode()}: use /v1/chat/completions, "
                "/v1/completions, /v1/embeddings or /v1/models"
            )
            await _respond(
                send, 404, errors.error_body(message, "invalid_request_error", "not_found")
            )

    # --- inference ------------------------------------------------------------------------
    async def inference(self, scope: Scope, receive: Receive, send: Send, path: bytes) -> None:
        arrived = time.perf_counter()
        body = await _read_body(receive)
        request_id, auth, priority = b"", b"", b""
        fwd: list[tuple[bytes, bytes]] = []
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                request_id = value
            elif name == b"authorization":
                auth = value
            elif name == b"x-priority":
                priority = value
            if name not in _DROP_REQUEST:
                fwd.append((name, value))
        if not request_id:
            request_id = b"%032x" % _random_bits(128)  # unique, needn't be secret
            fwd.append((b"x-request-id", request_id))
        rid_header = (b"x-request-id", request_id)

        async def fail(
            error: tuple[int, str],
            message: str,
            code: str,
            deployment: str = "",
            extra: tuple[tuple[bytes, bytes], ...] = (),
        ) -> None:
            status, type_ = error
            self.metrics.answered(deployment, str(status))
            body = errors.error_body(message, type_, code)
            await _respond(send, status, body, extra=(rid_header, *extra))

        tier, best = self.config.default_tier, 0
        if self.config.api_keys:
            key = auth[7:].decode(errors="replace") if auth[:7].lower() == b"bearer " else ""
            known = self.config.api_keys.get(key)
            if known is None:
                message = (
                    "invalid API key: send 'Authorization: Bearer <key>' with a key this "
                    "plane knows"
                )
                await fail(errors.UNAUTHORIZED, message, "invalid_api_key")
                return
            tier = best = known
        if priority:
            asked = _parse_tier(priority)
            if asked is not None:
                tier = max(asked, best)  # a header may lower a key's tier, never raise it
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            message = (
                f"the body is not valid JSON ({exc}): send a JSON object with at least 'model'"
            )
            await fail(errors.BAD_REQUEST, message, "invalid_json")
            return
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, str):
            message = "'model' is missing or not a string: name one of GET /v1/models"
            await fail(errors.BAD_REQUEST, message, "missing_model")
            return
        entry = self.router.resolve(model)
        if entry is None:
            known = ", ".join(m for m, _ in self.router.model_ids()) or "none"
            message = f"the model `{model}` does not exist on this plane; models: {known}"
            await fail(errors.NOT_FOUND, message, "model_not_found")
            return
        stream = payload.get("stream") is True
        ticket = Ticket(
            tier=min(max(tier, 0), self.config.tiers - 1),
            affinity_key=self._affinity_key(model, payload),
            adapter=model if model != entry.name else None,
        )
        dep = entry.name
        self.metrics.of(dep).request_bytes.observe(len(body))
        client = _Client(receive)
        try:
            exchange = await self.dispatcher.dispatch(
                entry, ticket, Forward(path.decode(), fwd, body, stream), client.gone
            )
            try:
                await self._relay(exchange.response, dep, stream, send, client, rid_header, arrived)
            finally:
                exchange.close()
        except QueueFullError as exc:
            message = (
                f"deployment {dep} has {len(entry.queue)} requests waiting, the most it "
                "holds: retry after the Retry-After seconds"
            )
            retry_after = ((b"retry-after", str(exc.retry_after).encode()),)
            await fail(errors.QUEUE_FULL, message, "queue_full", dep, retry_after)
        except QueueTimeoutError:
            message = (
                f"no replica of {dep} was free within {self.config.queue_max_wait_s:g}s: "
                "retry, or raise the deployment's replicas"
            )
            await fail(errors.QUEUE_TIMEOUT, message, "queue_timeout", dep)
        except NoCapacityError:
            message = (
                f"deployment {dep} has no replicas and may not start any (its quota max is "
                "0): ask for quota"
            )
            await fail(errors.NO_CAPACITY, message, "no_capacity", dep)
        except ClientGoneError:
            self.metrics.answered(dep, "499")
        except UpstreamError as exc:
            message = f"every replica tried failed: {exc}"
            await fail(errors.BAD_GATEWAY, message, "upstream_failed", dep)
        finally:
            client.close()

    def _affinity_key(self, model: str, payload: dict[str, Any]) -> str | None:
        limit = self.config.prefix_chars
        text = ""
        messages = payload.get("messages")
        if isinstance(messages, list):
            parts: list[str] = []
            size = 0
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                piece = content if isinstance(content, str) else json.dumps(content)
                parts.append(piece)
                size += len(piece)
                if size >= limit:
                    break
            text = "\x1f".join(parts)
        else:
            prompt = payload.get("prompt")
            if isinstance(prompt, list) and prompt:
                prompt = prompt[0]
            text = prompt if isinstance(prompt, str) else ""
        if len(text) < self.config.prefix_min_chars:
            return None
        return f"{model}\x1e{text[:limit]}"

    async def _relay(
        self,
        resp: Response,
        dep: str,
        stream: bool,
        send: Send,
        client: _Client,
        rid_header: tuple[bytes, bytes],
        arrived: float,
    ) -> None:
        headers = [(n, v) for n, v in resp.headers if n not in _DROP_RESPONSE]
        headers.append(rid_header)
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        gone = client.watching
        if stream:  # the head goes out now; else it leaves with the body, in one write
            await send(_FLUSH)
            gone = client.gone()
        size, events, first = 0, 0, 0.0
        tail = b""
        complete = False
        try:
            async for chunk in resp.body():
                if not first:
                    first = time.perf_counter()
                size += len(chunk)
                if stream:
                    events += chunk.count(b"data: ")
                    tail = chunk[-512:]
                elif size <= 65536:
                    tail += chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if gone is not None and gone.done():
                    raise ClientGoneError
            complete = True
        except UpstreamError as exc:
            log.warning("replica stream broke after the first byte (deployment %s): %s", dep, exc)
            if stream:  # no [DONE]: the client must not take a cut stream for a whole one
                error = errors.error_body(
                    f"the replica failed mid-stream ({exc}); the answer is incomplete: "
                    "send the request again",
                    "upstream_error",
                    "stream_broken",
                )
                chunk = b"data: " + error + b"\n\n"
                await send({"type": "http.response.body", "more_body": True, "body": chunk})
        finally:
            resp.release()
            if stream:
                client.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        end = time.perf_counter()
        self.metrics.answered(dep, str(resp.status) if complete else "502")
        m = self.metrics.of(dep)
        m.response_bytes.observe(size)
        m.e2e.observe(end - arrived)
        if first:
            m.ttft.observe(first - arrived)
        match = _USAGE.search(tail)
        tokens = int(match.group(1)) if match else max(events - 1, 0)
        if tokens and end > first:
            m.tokens_per_s.observe(tokens / (end - arrived))

    # --- other routes -------------------------------------------------------------------------
    async def models(self, send: Send) -> None:
        now = int(time.time())  # OpenAI's "created" is a wall-clock timestamp
        data = [
            {
                "id": m,
                "object": "model",
                "created": now,
                "owned_by": "gpufleet",
                "root": m,
                "parent": parent,
            }
            for m, parent in self.router.model_ids()
        ]
        await _respond(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def scrape(self, send: Send) -> None:
        m = self.metrics
        families: dict[str, list[str]] = {}
        for entry in self.router.deployments.values():
            in_flight, queued = self.router.load(entry.name)
            m.queue_depth.labels(entry.name).set(queued)
            m.in_flight.labels(entry.name).set(in_flight)
            phases = {"active": 0, "starting": 0, "ejected": 0, "draining": 0}
            for b in entry.backends.values():
                key = "ejected" if b.health.ejected else "active" if b.state == "ready" else b.state
                phases[key] = phases.get(key, 0) + 1
            for phase, n in phases.items():
                m.replicas.labels(entry.name, phase).set(n)
        backends = self.router.serving_backends()
        texts = await asyncio.gather(*(_fetch_metrics(b) for b in backends))
        for backend, text in zip(backends, texts, strict=True):
            if text:
                relabel_vllm(text, backend.replica_id, families)
        content_type = b"text/plain; version=0.0.4; charset=utf-8"
        await _respond(send, 200, m.render() + render_families(families), content_type)


class _Client:
    """The client's side of the connection: a watch for its disconnect, started on first
    need (waiting in the queue, streaming) and shared by both."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.watching: asyncio.Future[Any] | None = None

    def gone(self) -> asyncio.Future[Any]:
        if self.watching is None:
            self.watching = asyncio.ensure_future(self._receive())
        return self.watching

    def close(self) -> None:
        if self.watching is not None and not self.watching.done():
            self.watching.cancel()


def _parse_tier(value: bytes) -> int | None:
    text = value.decode(errors="replace").strip().lower()
    if text in _TIERS:
        return _TIERS[text]
    return int(text) if text.isdigit() else None


async def _fetch_metrics(backend: Backend) -> str:
    try:
        resp = await backend.pool.request("GET", "/metrics", head_timeout=1.0)
        text = await asyncio.wait_for(resp.read(), 1.0)
        resp.release()
        return text.decode(errors="replace") if resp.status == 200 else ""
    except (UpstreamError, TimeoutError):
        return ""


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
