"""The router's ASGI app: OpenAI-compatible routes in front of a plane's replicas.

Raw ASGI (no framework) because every microsecond here is added latency. Per request: read
the body, parse only ``model``, ``stream``, ``stream_options``, the prompt prefix and the
adapter; authenticate and pick a tier; take a replica slot (queueing if needed); forward the
body untouched; stream the response back as it arrives. Nothing of a prompt or completion
is ever logged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import re
import time
from typing import Any

from gpufleet_logging import request_id_bound
from workloadplane.router import errors
from workloadplane.router.core import (
    Backend,
    DeploymentEntry,
    DeploymentGoneError,
    NoCapacityError,
    QueueFullError,
    QueueTimeoutError,
    Router,
    Ticket,
)
from workloadplane.router.dispatch import Dispatcher, Forward
from workloadplane.router.front import (
    INFERENCE_PATHS,
    BadRequest,
    ClientGoneError,
    ClientWatch,
    Receive,
    Relayed,
    RequestHead,
    Scope,
    Send,
    choose_tier,
    grant_of,
    lifespan,
    parse_payload,
    read_body,
    read_head,
    refuse_key,
    relay,
    respond,
    unknown_key,
)
from workloadplane.router.metrics import RouterMetrics, relabel_vllm, render_families
from workloadplane.router.upstream import UpstreamError

log = logging.getLogger(__name__)

# at most 9 digits, not followed by a tenth: an engine's usage (the engine image is the
# tenant's) that claims more counts as none rather than overflowing the plane's counters
_USAGE = re.compile(rb'"completion_tokens":\s*(\d{1,9})(?!\d)')
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d{1,9})(?!\d)')
CROSS_REGION = b"x-gpufleet-cross-region"
"""Set by the gateway: ``1`` when the answer goes on to a client in another region."""


NOT_HOST = (
    "GET /internal/load answers only the plane's agent, on the router's own host; from "
    "elsewhere, read the plane's load from GET /metrics or its load reports on NATS"
)


def same_host(scope: Scope) -> bool:
    """The client is on the router's host: it connected from a loopback address, or from
    the address it reached the router on (an agent beside a router bound to 10.0.0.5 comes
    from 10.0.0.5). The plane's load names its deployments and their traffic: no business
    of a client's, wherever the router listens."""
    client, server = scope.get("client"), scope.get("server")
    if not client:
        return False
    host = client[0].removeprefix("::ffff:")  # an IPv4 peer on a dual-stack socket
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        return False
    return server is not None and client[0] == server[0]


class RouterApp:
    """HTTP only: parse the request, authenticate, hand it to the dispatcher, stream the
    answer back, and turn the dispatcher's typed errors into OpenAI-shaped ones."""

    def __init__(self, router: Router, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self.router = router
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.config = router.config
        self._shadows: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"].encode() if isinstance(scope["path"], str) else scope["path"]
        method = scope["method"]
        if method == "POST" and path in INFERENCE_PATHS:
            await self.inference(scope, receive, send, path)
        elif method == "GET" and path == b"/v1/models":
            head = read_head(scope["headers"])
            if self.config.api_keys and grant_of(self.config.api_keys, head.auth) is None:
                await refuse_key(send, head, "plane")  # as vLLM's --api-key guards /v1
            else:
                await self.models(send)
        elif method == "GET" and path == b"/metrics":
            await self.scrape(send)
        elif method == "GET" and path == b"/health":
            await respond(send, 200, b"", b"text/plain")
        elif method == "GET" and path == b"/internal/load":
            if same_host(scope):
                await respond(send, 200, json.dumps(self.router.load_report()).encode())
            else:
                status, type_ = errors.FORBIDDEN
                await respond(send, status, errors.error_body(NOT_HOST, type_, "not_on_this_host"))
        else:
            message = (
                f"no route {method} {path.decode()}: use /v1/chat/completions, "
                "/v1/completions, /v1/embeddings or /v1/models"
            )
            await respond(
                send, 404, errors.error_body(message, "invalid_request_error", "not_found")
            )

    # --- inference ------------------------------------------------------------------------
    async def inference(self, scope: Scope, receive: Receive, send: Send, path: bytes) -> None:
        head = read_head(scope["headers"])
        cross = (CROSS_REGION, b"1") in scope["headers"]
        with request_id_bound(head.request_id.decode()):  # on every line logged for it
            await self._inference(head, receive, send, path, cross)

    async def _inference(
        self, head: RequestHead, receive: Receive, send: Send, path: bytes, cross: bool
    ) -> None:
        arrived = time.perf_counter()
        body = await read_body(receive)
        rid_header = (b"x-request-id", head.request_id)

        async def fail(
            error: tuple[int, str],
            message: str,
            code: str,
            deployment: str = "",
            extra: tuple[tuple[bytes, bytes], ...] = (),
        ) -> None:
            status, type_ = error
            self.metrics.answered(deployment, str(status))
            if deployment and status >= 500:
                self.router.count_outcome(deployment, True, None, time.perf_counter() - arrived)
            log.debug("%s %s: %d %s", path.decode(), deployment or "-", status, code)
            body = errors.error_body(message, type_, code)
            await respond(send, status, body, extra=(rid_header, *extra))

        known = None
        if self.config.api_keys:
            known = grant_of(self.config.api_keys, head.auth)
            if known is None:
                await fail(errors.UNAUTHORIZED, unknown_key("plane"), "invalid_api_key")
                return
        tier = choose_tier(known, self.config.default_tier, head.priority, self.config.tiers)
        try:
            payload, model = parse_payload(body)
        except BadRequest as exc:
            await fail(errors.BAD_REQUEST, str(exc), exc.code)
            return
        entry = self.router.resolve(model)
        if entry is None:
            names = ", ".join(m for m, _ in self.router.model_ids()) or "none"
            message = f"the model `{model}` does not exist on this plane; models: {names}"
            await fail(errors.NOT_FOUND, message, "model_not_found")
            return
        stream = payload.get("stream") is True
        ticket = Ticket(
            tier=tier,
            affinity_key=self._affinity_key(model, payload),
            adapter=model if model != entry.name else None,
        )
        user = payload.get("user")
        entry = self.router.lane_for(  # a rollout's canary takes its share (sticky)
            entry, ticket.affinity_key or (user if isinstance(user, str) else None)
        )
        forward = Forward(path.decode(), head.forward, body, stream)
        for shadow in self.router.shadows_for(entry):
            self._mirror(shadow, forward)
        dep = entry.name
        self.metrics.of(dep).request_bytes.observe(len(body))
        client = ClientWatch(receive)
        try:
            exchange = await self.dispatcher.dispatch(entry, ticket, forward, client.gone)
            dep = exchange.deployment  # a lane's request may have moved to its deployment
            try:
                relayed = await relay(
                    exchange.response, stream, send, client, [rid_header], f"deployment {dep}"
                )
            finally:
                exchange.close()
            self._observe(dep, exchange.response.status, relayed, arrived, cross)
            log.debug(  # sizes, codes and ids only: never a prompt or a completion
                "%s %s: %d from replica %s, %d bytes in %.3f s",
                path.decode(),
                dep,
                exchange.response.status,
                exchange.replica_id,
                relayed.size,
                time.perf_counter() - arrived,
            )
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
        except DeploymentGoneError:
            message = (
                f"deployment {dep} was removed from this plane while the request waited: "
                "send it again; GET /v1/models lists the models served here"
            )
            await fail(errors.NO_CAPACITY, message, "deployment_removed", dep)
        except ClientGoneError:
            self.metrics.answered(dep, "499")
        except UpstreamError as exc:
            message = f"every replica tried failed: {exc}"
            await fail(errors.BAD_GATEWAY, message, "upstream_failed", dep)
        finally:
            client.close()

    def _mirror(self, shadow: DeploymentEntry, forward: Forward) -> None:
        """Send a copy of the request to a shadow lane, for its share of the requests: fire
        and forget (the user's answer never waits for it), at most
        ``shadow_max_in_flight`` at once (more are dropped and counted), its answer read
        and discarded, its outcome counted for the side-by-side comparison."""
        if random.random() >= shadow.share:
            return
        if len(self._shadows) >= self.config.shadow_max_in_flight:
            self.metrics.shadow.labels(shadow.name, "dropped").inc()
            self.router.count_dropped(shadow.name)
            return
        task = asyncio.create_task(self._shadow(shadow, forward), name=f"shadow-{shadow.name}")
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _shadow(self, shadow: DeploymentEntry, forward: Forward) -> None:
        began = time.perf_counter()
        never_gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket = Ticket(tier=self.config.tiers - 1)  # the least urgent tier
        first, complete, status = 0.0, False, 0
        try:
            async with asyncio.timeout(self.config.shadow_timeout_s):
                exchange = await self.dispatcher.dispatch(
                    shadow, ticket, forward, lambda: never_gone
                )
                try:
                    status = exchange.response.status
                    async for _ in exchange.response.body():
                        first = first or time.perf_counter()
                    complete = True
                finally:
                    exchange.close()
        except (QueueFullError, QueueTimeoutError, NoCapacityError, DeploymentGoneError):
            self.metrics.shadow.labels(shadow.name, "dropped").inc()
            self.router.count_dropped(shadow.name)
            return
        except (UpstreamError, TimeoutError):  # an error, counted below
            pass
        except Exception:  # a shadow must never hurt the router
            log.exception("shadow request to %s failed", shadow.name)
        error = status >= 500 or not complete
        end = time.perf_counter()
        self.router.count_outcome(shadow.name, error, first - began if first else None, end - began)
        self.metrics.shadow.labels(shadow.name, "error" if error else "answered").inc()

    async def close_shadows(self) -> None:
        for task in list(self._shadows):
            task.cancel()
        await asyncio.gather(*self._shadows, return_exceptions=True)

    def _observe(
        self, dep: str, status: int, r: Relayed, arrived: float, cross_region: bool = False
    ) -> None:
        end = time.perf_counter()
        self.metrics.answered(dep, str(status) if r.complete else "502")
        m = self.metrics.of(dep)
        m.response_bytes.observe(r.size)
        m.e2e.observe(end - arrived)
        if r.first:
            m.ttft.observe(r.first - arrived)
        self.router.count_outcome(
            dep,
            status >= 500 or not r.complete,
            r.first - arrived if r.first else None,
            end - arrived,
        )
        if r.complete:
            ttft = r.first - arrived if r.first else None
            self.metrics.recent.finished(dep, self.router.clock(), ttft)
        match = _USAGE.search(r.tail)
        tokens = int(match.group(1)) if match else max(r.events - 1, 0)
        if r.complete and 200 <= status < 300:
            prompt = _PROMPT.search(r.tail)
            prompt_tokens = int(prompt.group(1)) if prompt else 0
            self.router.count_usage(dep, prompt_tokens, tokens, r.size, cross_region)
            m.input_tokens.inc(prompt_tokens)
            m.output_tokens.inc(tokens)
        if tokens and end > r.first:
            m.tokens_per_s.observe(tokens / (end - arrived))

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
        await respond(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def scrape(self, send: Send) -> None:
        m = self.metrics
        families: dict[str, list[str]] = {}
        m.prune(set(self.router.deployments))
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
        await respond(send, 200, m.render() + render_families(families), content_type)


async def _fetch_metrics(backend: Backend) -> str:
    try:
        resp = await backend.pool.request("GET", "/metrics", head_timeout=1.0)
        text = await resp.read_within(1.0)
        return text.decode(errors="replace") if resp.status == 200 else ""
    except (UpstreamError, TimeoutError):
        return ""
