"""The gateway's ASGI app: the router's OpenAI surface (its front: ``router/front.py``) in
front of the fleet's planes.

Per request: read it as the router does (body, X-Request-Id, API key and tier, ``model``),
rank the deployment's planes (``GatewayState.choose`` → the pure ``choice.rank``), send to
the first; a connection error or abort before the response head takes that plane out of
rotation and sends the request to the next one (nothing was delivered, nothing is lost); a
429/502/503 from a plane before any byte tries the next plane without ejecting it. Streams
are relayed event by event and, if the plane dies mid-stream, continued on another plane
(``continuation.py``). Responses carry ``x-gpufleet-plane`` and ``x-gpufleet-route`` (why).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs

from gpufleet_logging import bind_request_id, unbind_request_id
from workloadplane.gateway.choice import Choice, Ranked, allowed_jurisdictions
from workloadplane.gateway.continuation import (
    StreamTracker,
    continuation,
    counted,
    not_continuable,
)
from workloadplane.gateway.state import Attempt, GatewayState, Plane
from workloadplane.router import errors
from workloadplane.router.front import (
    FLUSH,
    INFERENCE_PATHS,
    BadRequest,
    ClientGoneError,
    ClientWatch,
    Receive,
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
    send_stream_error,
    unknown_key,
)
from workloadplane.router.httpserver import Connection, Exchange
from workloadplane.router.keys import KeyGrant
from workloadplane.router.upstream import Connection as UpstreamConnection
from workloadplane.router.upstream import Response, UpstreamAborted, UpstreamError

log = logging.getLogger(__name__)
_Callback = TypeVar("_Callback", bound=Callable[..., None])

CLIENT_REGION = b"x-gpufleet-client-region"
JURISDICTION = b"x-gpufleet-jurisdiction"
CROSS_REGION = b"x-gpufleet-cross-region"
"""To the plane: ``1`` when the client is in another region than the plane (the router
counts those bytes as data transfer); a client's own is dropped."""
_EXTRA = frozenset({CLIENT_REGION, JURISDICTION, CROSS_REGION})
_NEXT_PLANE_STATUS = frozenset({429, 502, 503})
_DROP_RESPONSE = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}
_DROP_RESPONSE |= {b"x-request-id", b"content-length"}
_WHOLE_BYTES = 256 * 1024
"""A non-streamed answer is held until whole (one write) up to this size; past it, its
head goes out and the rest follows as it comes."""
NO_PLANE = 503, "service_unavailable_error"


@dataclass
class GatewayConfig:
    api_keys: dict[str, KeyGrant] = field(default_factory=dict)
    """sha256 hex of each key → its grant; empty: no authentication."""
    tiers: int = 3
    default_tier: int = 1
    max_attempts: int = 3
    continuations: int = 2
    """How many times one stream may move to another plane."""
    continuation_wait_s: float = 5.0
    """When no plane can take a broken stream at once, how long it waits for one that was
    cut only softly (the gateway's own late probe, or a replica failing inside a live
    plane) to be back in rotation."""
    head_timeout_s: float | None = None
    """Deadline for a plane's response head (None: planes queue requests; hung planes are
    found by the probes)."""
    plane_api_key: str | None = None
    """Sent to the planes' routers as the bearer token, when they check keys."""
    max_body_bytes: int = 16 * 1024 * 1024
    max_headers: int = 100
    max_header_bytes: int = 64 * 1024


class Refused(Exception):
    """No plane may serve: the message names the jurisdiction."""


@dataclass(slots=True)
class Admitted:
    """A request the gateway will send to a plane, as read once."""

    head: RequestHead
    path: str
    model: str
    payload: dict[str, Any]
    body: bytes
    """What goes to the plane (a stream asks for the engine's token counts)."""
    size: int
    """The client's body, bytes."""
    stream: bool
    why: str
    """Why the stream could not be continued on another plane ("" if it can)."""
    region: str | None
    asked: frozenset[str]
    forward: list[tuple[bytes, bytes]]
    arrived: float


@dataclass(slots=True)
class Refusal:
    """A request answered with an error before (or instead of) any plane."""

    head: RequestHead
    path: str
    error: tuple[int, str]
    message: str
    code: str
    deployment: str = ""


class _Opened:
    def __init__(self, resp: Response, plane: Plane, attempt: Attempt, ranked: Ranked) -> None:
        self.resp, self.plane, self.attempt, self.ranked = resp, plane, attempt, ranked


class GatewayApp:
    def __init__(self, state: GatewayState, config: GatewayConfig) -> None:
        self.state = state
        self.config = config
        self.metrics = state.metrics
        self._whys: dict[int, tuple[Ranked, bytes]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"].encode() if isinstance(scope["path"], str) else scope["path"]
        method = scope["method"]
        if method == "POST" and path in INFERENCE_PATHS:
            await self.inference(scope, receive, send, path.decode())
        elif method == "GET" and path in (b"/v1/models", b"/debug/routes"):
            head = read_head(scope["headers"])
            grant = grant_of(self.config.api_keys, head.auth) if self.config.api_keys else None
            if self.config.api_keys and grant is None:
                await refuse_key(send, head, "gateway")  # the fleet's map is not public
            elif path == b"/v1/models":
                await self.models(send)
            else:
                await self.debug_routes(scope, send, grant)
        elif method == "GET" and path == b"/health":
            await respond(send, 200, b"", b"text/plain")
        elif method == "GET" and path == b"/metrics":
            from prometheus_client import generate_latest

            body = generate_latest(self.metrics.registry)
            await respond(send, 200, body, b"text/plain; version=0.0.4; charset=utf-8")
        else:
            message = (
                f"no route {method} {path.decode()}: use /v1/chat/completions, "
                "/v1/completions, /v1/embeddings, /v1/models or /debug/routes?model=NAME"
            )
            await respond(
                send, 404, errors.error_body(message, "invalid_request_error", "not_found")
            )

    # --- inference ------------------------------------------------------------------------
    async def inference(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        arrived = time.perf_counter()
        head = read_head(scope["headers"], _EXTRA)
        body = await read_body(receive)
        await self._answer(self._admit(head, body, path, arrived), receive, send, set())

    def fast(self, scope: Scope, body: bytes, conn: Connection) -> Exchange | None:
        """The HTTP server's callback path (``HttpServer(fast=...)``): a request that is
        admitted, not streamed, and whose first plane has an idle kept-alive connection
        is relayed from callbacks (``_Relay``: no task, no ASGI messages); any other
        inference request is handed over to the task path at once (its checks done once);
        other routes run the app."""
        if scope["method"] != "POST":
            return None
        path = scope["path"]
        if path.encode() not in INFERENCE_PATHS:
            return None
        arrived = time.perf_counter()
        admitted = self._admit(read_head(scope["headers"], _EXTRA), body, path, arrived)
        if isinstance(admitted, Admitted) and not admitted.stream:
            choice = self.state.choose(admitted.model, admitted.region, admitted.asked)
            if choice is not None and choice.ranked and not choice.last_resort:
                ranked = choice.ranked[0]
                plane = self.state.planes[ranked.cluster]
                upstream = plane.pool.take_idle()
                if upstream is not None:
                    relay = _Relay(self, admitted, conn, choice, ranked, plane, upstream)
                    relay.start()
                    return relay
        self.hand_over(conn, admitted, set())
        return None

    def hand_over(self, conn: Connection, admitted: Admitted | Refusal, tried: set[str]) -> None:
        async def answer(receive: Receive, send: Send) -> None:
            await self._answer(admitted, receive, send, tried)

        conn.hand_over(answer)

    def _admit(
        self, head: RequestHead, body: bytes, path: str, arrived: float
    ) -> Admitted | Refusal:
        """Who asks, for what, and where it may go; or why it is refused before any plane."""
        grant = None
        if self.config.api_keys:
            grant = grant_of(self.config.api_keys, head.auth)
            if grant is None:
                message = unknown_key("gateway")
                return Refusal(head, path, errors.UNAUTHORIZED, message, "invalid_api_key")
        tier = choose_tier(
            grant.tier if grant else None,
            self.config.default_tier,
            head.priority,
            self.config.tiers,
        )
        try:
            payload, model = parse_payload(body)
        except BadRequest as exc:
            return Refusal(head, path, errors.BAD_REQUEST, str(exc), exc.code)
        if model not in self.state.routes:
            names = ", ".join(sorted(self.state.routes)) or "none"
            message = f"the model `{model}` does not exist in this fleet; models: {names}"
            return Refusal(head, path, errors.NOT_FOUND, message, "model_not_found")
        wanted = parse_jurisdictions(head.wanted.get(JURISDICTION, b"").decode(errors="replace"))
        if wanted is None:
            return Refusal(
                head, path, errors.BAD_REQUEST, NOT_JURISDICTIONS, "invalid_jurisdiction", model
            )
        asked = _jurisdictions(wanted, grant)
        if asked is None:
            assert grant is not None  # without a key every valid list is allowed
            message = (
                f"x-gpufleet-jurisdiction asks for {','.join(sorted(wanted))}, outside what "
                f"this API key may use ({', '.join(sorted(grant.jurisdictions))})"
            )
            return Refusal(
                head, path, errors.BAD_REQUEST, message, "jurisdiction_not_allowed", model
            )
        route = self.state.routes[model]
        if allowed_jurisdictions(route, asked) is None:  # no plane ever may: not a 503
            message = (
                f"deployment {model} may be served only in {', '.join(route.jurisdictions)}; "
                f"the request (x-gpufleet-jurisdiction or its API key) allows only "
                f"{', '.join(sorted(asked))}: ask for one of the deployment's"
            )
            return Refusal(
                head, path, errors.BAD_REQUEST, message, "jurisdiction_not_allowed", model
            )
        region = head.wanted.get(CLIENT_REGION, b"").decode(errors="replace").strip() or None
        size = len(body)
        stream = payload.get("stream") is True
        why = not_continuable(path, payload) if stream else "not streamed"
        if not why:  # the engine's own token counts, should the stream need continuing
            body = json.dumps(counted(payload)).encode()
        forward = _upstream_headers(head, tier, self.config.plane_api_key)
        return Admitted(
            head, path, model, payload, body, size, stream, why, region, asked, forward, arrived
        )

    async def _answer(
        self, admitted: Admitted | Refusal, receive: Receive, send: Send, tried: set[str]
    ) -> None:
        token = bind_request_id(admitted.head.request_id.decode())  # on every line logged
        try:
            if isinstance(admitted, Refusal):
                await self._refuse(admitted, send)
            else:
                await self._serve(admitted, receive, send, tried)
        finally:
            unbind_request_id(token)

    async def _refuse(self, refusal: Refusal, send: Send) -> None:
        status, type_ = refusal.error
        self.metrics.answered(refusal.deployment, "", status).inc()
        log.debug("%s %s: %d %s", refusal.path, refusal.deployment or "-", status, refusal.code)
        body = errors.error_body(refusal.message, type_, refusal.code)
        await respond(send, status, body, extra=((b"x-request-id", refusal.head.request_id),))

    async def _serve(self, a: Admitted, receive: Receive, send: Send, tried: set[str]) -> None:
        head, path, model = a.head, a.path, a.model
        rid = (b"x-request-id", head.request_id)
        client = ClientWatch(receive)
        # a client that leaves while the plane has not answered yet (queued there, or
        # scaling from zero) takes its request with it: the plane would run it for nobody
        opening = asyncio.ensure_future(
            self._open(model, path, a.forward, a.body, a.stream, a.region, a.asked, tried)
        )
        gone = client.gone()
        await asyncio.wait((opening, gone), return_when=asyncio.FIRST_COMPLETED)
        if not opening.done():
            opening.cancel()  # closes the upstream connection: the plane drops the request
            with contextlib.suppress(asyncio.CancelledError, Refused, UpstreamError):
                await opening
            client.close()
            self._served(a, "", 499, time.perf_counter() - a.arrived, 0)
            return
        try:
            opened = opening.result()
        except Refused as exc:
            client.close()
            self.metrics.request_size.labels(model).observe(a.size)
            await self._refuse(
                Refusal(head, path, NO_PLANE, str(exc), "no_healthy_plane", model), send
            )
            return
        except UpstreamError as exc:
            client.close()
            self.metrics.request_size.labels(model).observe(a.size)
            message = f"every plane tried failed: {exc}"
            await self._refuse(
                Refusal(head, path, errors.BAD_GATEWAY, message, "upstream_failed"), send
            )
            return
        head_s = time.perf_counter() - a.arrived  # observed once the client has its answer
        ours = [
            rid,
            (b"x-gpufleet-plane", opened.plane.cluster.encode()),
            (b"x-gpufleet-route", self._route_header(opened.ranked)),
        ]
        status, sent, plane = opened.resp.status, 0, opened.plane.cluster
        try:
            if a.stream and status == 200 and _event_stream(opened.resp):
                request = (path, a.payload, a.why, a.region, a.asked, a.forward)
                sent = await self._stream(opened, ours, send, client, request)
            else:
                try:
                    relayed = await relay(
                        opened.resp, a.stream, send, client, ours, f"plane {opened.plane.cluster}"
                    )
                    sent = relayed.size
                except UpstreamError as exc:  # it broke before its body: nothing went out
                    status = errors.BAD_GATEWAY[0]
                    message = f"plane {plane} failed before its answer's body: {exc}"
                    body = errors.error_body(message, errors.BAD_GATEWAY[1], "upstream_failed")
                    await respond(send, status, body, extra=(rid,))
                finally:
                    opened.plane.attempts.discard(opened.attempt)
        except ClientGoneError:
            status = 499
        finally:
            client.close()
        self._served(a, plane, status, head_s, sent)

    def _served(self, a: Admitted, plane: str, status: int, head_s: float, sent: int) -> None:
        served = self.metrics.served(a.model, plane)
        served.request_size.observe(a.size)
        served.head_time.observe(head_s)
        served.response_size.observe(sent)
        served.duration.observe(time.perf_counter() - a.arrived)
        self.metrics.answered(a.model, plane, status).inc()
        log.debug("%s %s: %d from plane %s", a.path, a.model, status, plane)

    def _route_header(self, ranked: Ranked) -> bytes:
        """``x-gpufleet-route``: the serving plane's ``why``, formatted once per ranking
        (``GatewayState.choose`` hands the same one out while its inputs hold)."""
        kept = self._whys.get(id(ranked))
        if kept is not None and kept[0] is ranked:
            return kept[1]
        if len(self._whys) >= 256:
            self._whys.clear()
        value = ranked.why.encode(errors="replace")
        self._whys[id(ranked)] = (ranked, value)
        return value

    async def _open(
        self,
        model: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        stream: bool,
        region: str | None,
        asked: frozenset[str],
        tried: set[str],
    ) -> _Opened:
        """The first plane (in ranking order, skipping ``tried``) whose response head came.
        Raises ``Refused`` (nothing may serve) or the last ``UpstreamError``."""
        last: UpstreamError | None = None
        resort: Choice | None = None  # the last attempt's choice, if a last resort
        for attempt_no in range(self.config.max_attempts):
            choice = self.state.choose(model, region, asked)
            if choice is None:
                raise Refused(f"deployment {model} left the routing table")
            candidates = [r for r in choice.ranked if r.cluster not in tried]
            if not candidates:
                if choice.last_resort and last is not None:
                    raise Refused(f"{_refusal(choice)}; tried anyway: {last}")
                if choice.ranked and last is not None:
                    raise last  # every healthy plane was tried and failed
                raise Refused(_refusal(choice))
            resort = choice if choice.last_resort else None
            ranked = candidates[0]
            plane = self.state.planes[ranked.cluster]
            tried.add(ranked.cluster)
            attempt = Attempt(model, asked)
            plane.attempts.add(attempt)

            def abortable(abort: Any, attempt: Attempt = attempt) -> None:
                attempt.cancel = abort

            try:
                resp = await plane.pool.request(
                    "POST",
                    path,
                    [*headers, (CROSS_REGION, b"1" if _crosses(choice, ranked) else b"0")],
                    body,
                    head_timeout=self.config.head_timeout_s,
                    connect_timeout=0.5,
                    on_abortable=abortable,
                )
            except UpstreamError as exc:
                plane.attempts.discard(attempt)
                last = exc
                if not isinstance(exc, UpstreamAborted) or not plane.health.ejected:
                    self.state.failed(plane.cluster, str(exc))
                self.metrics.failovers.labels("before_first_byte").inc()
                continue
            except BaseException:  # cancelled: the client left
                plane.attempts.discard(attempt)
                raise
            attempt.cancel = None
            # the last attempt's "busy" goes to the client as it is (its 429 and retry-after),
            # not as a 502 for a plane that answered
            more = len(candidates) > 1 and attempt_no < self.config.max_attempts - 1
            if resp.status in _NEXT_PLANE_STATUS and more:
                resp.discard()
                plane.attempts.discard(attempt)
                self.metrics.failovers.labels(f"status_{resp.status}").inc()
                last = UpstreamError(
                    f"plane {plane.cluster} answered {resp.status}", before_first_byte=True
                )
                continue
            attempt.started = True
            attempt.cut = resp.cut
            attempt.alive_at = self.state.clock()
            return _Opened(resp, plane, attempt, ranked)
        assert last is not None
        if resort is not None:  # the attempts ran out on planes out of rotation
            raise Refused(f"{_refusal(resort)}; tried anyway: {last}")
        raise last

    async def _stream(
        self,
        opened: _Opened,
        ours: list[tuple[bytes, bytes]],
        send: Send,
        client: ClientWatch,
        request: tuple[
            str, dict[str, Any], str, str | None, frozenset[str], list[tuple[bytes, bytes]]
        ],
    ) -> int:
        """Relay an SSE stream event by event; when its plane dies before ``[DONE]``,
        continue it on another plane (one stream, no repeated or missing text, one
        ``[DONE]``), or end it with an OpenAI-shaped error event when it cannot be.
        Returns the bytes of events relayed."""
        headers = [(n, v) for n, v in opened.resp.headers if n not in _DROP_RESPONSE]
        await send({"type": "http.response.start", "status": 200, "headers": headers + ours})
        await send(FLUSH)
        gone = client.gone()
        current = [opened]

        def left(_: object) -> None:  # a silent plane's stream ends when its client leaves
            if not gone.cancelled():
                current[0].resp.cut("the client left")

        gone.add_done_callback(left)
        try:
            return await self._relay_stream(
                opened, send, gone, current, tried_first=opened.plane.cluster, request=request
            )
        finally:
            gone.remove_done_callback(left)

    async def _relay_stream(
        self,
        opened: _Opened,
        send: Send,
        gone: asyncio.Future[Any],
        current: list[_Opened],
        *,
        tried_first: str,
        request: tuple[
            str, dict[str, Any], str, str | None, frozenset[str], list[tuple[bytes, bytes]]
        ],
    ) -> int:
        path, payload, cannot, region, asked, forward = request
        sent = 0
        tracker = StreamTracker.of(path, payload)
        tried = {tried_first}
        hard: set[str] = set()
        """Planes whose connection broke: never asked to continue this stream again."""
        moves = 0
        while True:
            broken = ""
            try:
                async for chunk in opened.resp.body():
                    opened.plane.last_byte_at = opened.attempt.alive_at = self.state.clock()
                    for event in tracker.feed(chunk):
                        sent += len(event)
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    if gone.done():
                        raise ClientGoneError
                if not tracker.done:
                    broken = tracker.upstream_error or "the plane ended the stream without [DONE]"
            except UpstreamError as exc:
                if gone.done():
                    raise ClientGoneError from None
                # after [DONE] the answer is whole: only the chunked end was lost (continued
                # or failed, the client would get a second [DONE] or an error after it)
                broken = "" if tracker.done else str(exc)
                if broken and not opened.attempt.cut_here:  # not our own cut
                    hard.add(opened.plane.cluster)
            finally:
                opened.resp.release()
                opened.plane.attempts.discard(opened.attempt)
            if not broken:
                break
            log.warning("stream from plane %s broke: %s", opened.plane.cluster, broken)
            if not tracker.upstream_error:  # else the plane lives; one of its replicas died
                self.state.failed(opened.plane.cluster, f"stream broke: {broken}")
            why = cannot or tracker.why_not
            if not why and moves >= self.config.continuations:
                why = f"it moved {moves} times already"
            nxt = None if why else continuation(path, counted(payload), tracker)
            if not why and nxt is None:  # every token asked for was delivered
                await send(
                    {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True}
                )
                break
            if not why and nxt is not None:
                moves += 1
                tracker.next_segment()
                try:
                    body = json.dumps(nxt).encode()
                    opened = await self._reopen(
                        str(payload["model"]), path, forward, body, region, asked, (tried, hard)
                    )
                    if opened.resp.status == 200:
                        current[0] = opened
                        self.metrics.failovers.labels("mid_stream").inc()
                        continue
                    why = f"plane {opened.plane.cluster} answered {opened.resp.status}"
                    opened.resp.discard()
                    opened.plane.attempts.discard(opened.attempt)
                except (Refused, UpstreamError) as exc:
                    why = f"no plane could continue it ({exc})"
            await send_stream_error(
                send,
                f"the plane failed mid-stream and the stream cannot be continued: {why}; "
                "the answer is incomplete: send the request again",
                "stream_broken",
            )
            break
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return sent

    async def _reopen(
        self,
        model: str,
        path: str,
        forward: list[tuple[bytes, bytes]],
        body: bytes,
        region: str | None,
        asked: frozenset[str],
        planes: tuple[set[str], set[str]],
    ) -> _Opened:
        """A plane to continue a broken stream on: one not tried yet; else, within
        ``continuation_wait_s``, one tried before whose connection did not break (it was
        cut for a late probe on a loaded machine, or a replica failed inside it) once it is
        back in rotation. Raises ``Refused`` or ``UpstreamError`` as ``_open`` does."""
        tried, hard = planes
        try:
            return await self._open(model, path, forward, body, True, region, asked, tried)
        except (Refused, UpstreamError) as exc:
            if tried <= hard:
                raise
            first = exc
        deadline = self.state.clock() + self.config.continuation_wait_s
        while self.state.clock() < deadline:
            choice = self.state.choose(model, region, asked)
            if choice is None:
                break
            if not choice.last_resort and any(r.cluster not in hard for r in choice.ranked):
                tried.intersection_update(hard)  # the soft ones may be asked again
                return await self._open(model, path, forward, body, True, region, asked, tried)
            await asyncio.sleep(0.05)
        raise first

    # --- other routes ---------------------------------------------------------------------
    async def models(self, send: Send) -> None:
        now = int(time.time())
        data = [
            {"id": name, "object": "model", "created": now, "owned_by": "gpufleet", "root": name}
            for name in sorted(self.state.routes)
        ]
        await respond(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def debug_routes(self, scope: Scope, send: Send, grant: KeyGrant | None = None) -> None:
        """The ranking a request with ``?model=``, ``?region=`` and ``?jurisdiction=`` (as
        its header) would get with the caller's API key: within the key's jurisdictions."""
        query = parse_qs((scope.get("query_string") or b"").decode(errors="replace"))
        model = (query.get("model") or [""])[0]
        region = (query.get("region") or [None])[0]
        wanted = parse_jurisdictions((query.get("jurisdiction") or [""])[0])
        asked = None if wanted is None else _jurisdictions(wanted, grant)
        if wanted is not None and asked is None:
            assert grant is not None
            message = (
                f"?jurisdiction= asks for {','.join(sorted(wanted))}, outside what this API key "
                f"may use ({', '.join(sorted(grant.jurisdictions))})"
            )
            body = errors.error_body(message, "invalid_request_error", "jurisdiction_not_allowed")
            await respond(send, 400, body)
            return
        if asked is None:
            body = errors.error_body(
                NOT_JURISDICTIONS.replace("x-gpufleet-jurisdiction", "?jurisdiction="),
                "invalid_request_error",
                "invalid_jurisdiction",
            )
            await respond(send, 400, body)
            return
        choice = self.state.choose(model, region, asked)
        if choice is None:
            names = ", ".join(sorted(self.state.routes)) or "none"
            message = f"no deployment `{model}` in the routing table; give ?model= one of: {names}"
            await respond(
                send, 404, errors.error_body(message, "invalid_request_error", "model_not_found")
            )
            return
        await respond(send, 200, json.dumps(_describe(choice, self.state)).encode())


def _guarded(method: _Callback) -> _Callback:
    """A ``_Relay`` callback whose unexpected exception (a fault of the gateway's own) ends
    the exchange (``_Relay.broke``) instead of escaping into the connection's parser, where
    nothing would ever answer the client."""

    @functools.wraps(method)
    def guarded(relay: _Relay, *args: object) -> None:
        try:
            method(relay, *args)
        except Exception as exc:
            relay.broke(exc)

    return cast(_Callback, guarded)


class _Relay:
    """One admitted, non-streamed request relayed to its first plane on a kept-alive
    connection from callbacks (the server's ``Exchange``, the connection's ``Listener``):
    the answer goes out in one write when it is whole (a long one as it comes, pausing the
    plane when the client is slow). What the task path would do differently is handed
    over to it before any byte reached the client: a 429/502/503 with another plane ranked
    (that plane is tried next), the plane ejected or the head deadline passed before the
    head (the next plane), or the kept-alive connection found closed (the task path opens a
    fresh one, and ejects the plane if that fails). Once the plane sent bytes the request
    may have run: a break then is answered 502 (or, with the head already out, the client's
    connection is closed), never retried."""

    def __init__(
        self,
        app: GatewayApp,
        admitted: Admitted,
        conn: Connection,
        choice: Choice,
        ranked: Ranked,
        plane: Plane,
        upstream: UpstreamConnection,
    ) -> None:
        self.app, self.a, self.conn = app, admitted, conn
        self.choice, self.ranked, self.plane, self.upstream = choice, ranked, plane, upstream
        self.attempt = Attempt(admitted.model, admitted.asked)
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.sent = 0
        self.head_s = 0.0
        self.streaming = False
        """The head went out before the end (a long answer): chunks are written as they come."""
        self.full = False
        self.over = False
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        a, plane, upstream = self.a, self.plane, self.upstream
        plane.attempts.add(self.attempt)
        self.attempt.cancel = upstream.abort
        crossing = b"1" if _crosses(self.choice, self.ranked) else b"0"
        raw = plane.pool.encode("POST", a.path, [*a.forward, (CROSS_REGION, crossing)], a.body)
        timeout = self.app.config.head_timeout_s
        if timeout is not None:
            self.timer = asyncio.get_running_loop().call_later(
                timeout, upstream.abort, f"no response within {timeout}s"
            )
        upstream.relay(raw, self)

    # --- the plane's side -----------------------------------------------------------------
    @_guarded
    def on_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.over:
            return
        if self.timer is not None:
            self.timer.cancel()
        app, plane = self.app, self.plane
        if status in _NEXT_PLANE_STATUS and len(self.choice.ranked) > 1:
            self._leave()
            app.metrics.failovers.labels(f"status_{status}").inc()
            app.hand_over(self.conn, self.a, {plane.cluster})
            return
        self.head_s = time.perf_counter() - self.a.arrived
        attempt = self.attempt
        attempt.started, attempt.cut = True, self.upstream.cut
        attempt.alive_at = app.state.clock()
        self.status = status
        out = [(n, v) for n, v in headers if n not in _DROP_RESPONSE]
        out += (
            (b"x-request-id", self.a.head.request_id),
            (b"x-gpufleet-plane", plane.cluster.encode()),
            (b"x-gpufleet-route", app._route_header(self.ranked)),
        )
        self.headers = out

    @_guarded
    def on_chunk(self, chunk: bytes) -> None:
        if self.over:
            return
        if self.streaming:
            self.sent += len(chunk)
            self.full = self.conn.emit(
                {"type": "http.response.body", "body": chunk, "more_body": True}
            )
        else:
            self.chunks.append(chunk)
            self.buffered += len(chunk)

    @_guarded
    def on_read(self) -> None:
        if self.over or not self.status:
            return
        if not self.streaming and self.buffered > _WHOLE_BYTES:
            self.streaming = True
            body = b"".join(self.chunks)
            self.chunks, self.sent = [], len(body)
            self.conn.emit(
                {"type": "http.response.start", "status": self.status, "headers": self.headers}
            )
            self.full = self.conn.emit(
                {"type": "http.response.body", "body": body, "more_body": True}
            )
        if self.full:
            self.upstream.pause_reading()

    @_guarded
    def on_end(self) -> None:
        if self.over:
            return
        self._leave(keep=True)
        conn = self.conn
        if self.streaming:
            conn.emit({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
            self.sent = len(body)
            headers = [*self.headers, (b"content-length", b"%d" % len(body))]
            conn.emit({"type": "http.response.start", "status": self.status, "headers": headers})
            conn.emit({"type": "http.response.body", "body": body, "more_body": False})
        conn.done()
        self._account(self.status)

    @_guarded
    def on_error(self, exc: UpstreamError) -> None:
        if self.over:
            return
        app, plane = self.app, self.plane
        self._leave()
        if exc.before_first_byte:  # nothing of an answer came: it ran nowhere
            if isinstance(exc, UpstreamAborted):  # ejected, or the head deadline passed
                if not plane.health.ejected:
                    app.state.failed(plane.cluster, str(exc))
                app.metrics.failovers.labels("before_first_byte").inc()
                app.hand_over(self.conn, self.a, {plane.cluster})
            else:  # the kept-alive connection was closed: the task path opens a fresh one
                app.hand_over(self.conn, self.a, set())
            return
        token = bind_request_id(self.a.head.request_id.decode())
        log.warning("plane %s failed while answering: %s", plane.cluster, exc)
        unbind_request_id(token)
        if self.streaming:  # the head is out: the client must not take a cut body for whole
            self.conn.abort(b"")
        else:
            message = (
                f"plane {plane.cluster} failed while answering ({exc}); the request may "
                "have run there: send it again"
            )
            body = errors.error_body(message, "upstream_error", "upstream_failed")
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"x-request-id", self.a.head.request_id),
                (b"x-gpufleet-plane", plane.cluster.encode()),
            ]
            self.conn.emit({"type": "http.response.start", "status": 502, "headers": headers})
            self.conn.emit({"type": "http.response.body", "body": body, "more_body": False})
        self.conn.done()
        self._account(502)

    # --- the client's side ----------------------------------------------------------------
    @_guarded
    def client_gone(self) -> None:
        if self.over:
            return
        self._leave()
        self._account(499)

    @_guarded
    def resume(self) -> None:
        if self.full and not self.over:
            self.full = False
            self.upstream.resume_reading()

    def broke(self, exc: Exception) -> None:
        """A callback failed (a bug): logged, the plane's connection closed, the client
        answered 500 if nothing of the answer went out yet, else its connection closed."""
        log.error("the gateway failed relaying a request: %r", exc, exc_info=exc)
        first = not self.over
        if first:
            self._leave()
        conn = self.conn
        if conn.exchange is not self:  # answered, handed over, or the client went
            return
        try:
            if conn._started:
                raise RuntimeError("the answer's head is out")
            body = errors.error_body(
                "the gateway failed while relaying this request; it may have run on plane "
                f"{self.plane.cluster}: send it again",
                "api_error",
                "internal_error",
            )
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"x-request-id", self.a.head.request_id),
            ]
            conn.emit({"type": "http.response.start", "status": 500, "headers": headers})
            conn.emit({"type": "http.response.body", "body": body, "more_body": False})
        except Exception:
            conn.abort(b"")
        conn.done()
        if first:
            with contextlib.suppress(Exception):
                self._account(500)

    def _account(self, status: int) -> None:
        """The metrics and the log line, once the client has its answer."""
        token = bind_request_id(self.a.head.request_id.decode())
        try:
            self.app._served(self.a, self.plane.cluster, status, self.head_s, self.sent)
        finally:
            unbind_request_id(token)

    def _leave(self, keep: bool = False) -> None:
        """Done with the plane: the connection back to its pool (``keep``, when reusable)
        or closed."""
        self.over = True
        if self.timer is not None:
            self.timer.cancel()
        self.plane.attempts.discard(self.attempt)
        if keep and self.upstream.reusable:
            self.plane.pool.put_back(self.upstream)
        else:
            self.upstream.close()


MAX_JURISDICTIONS = 16
NOT_JURISDICTIONS = (
    f"x-gpufleet-jurisdiction is a comma-separated list of at most {MAX_JURISDICTIONS} "
    "two-letter country codes (ISO 3166-1), like 'DE,FR'"
)
_COUNTRY = re.compile(r"[A-Z]{2}")


def parse_jurisdictions(raw: str) -> frozenset[str] | None:
    """The country codes of an ``x-gpufleet-jurisdiction`` value (None: not a list of at
    most MAX_JURISDICTIONS two-letter codes). Bounded: each distinct list is a key of the
    gateway's ranking cache and is named in its answers."""
    codes = [j.strip().upper() for j in raw.split(",", MAX_JURISDICTIONS + 1) if j.strip()]
    if len(codes) > MAX_JURISDICTIONS or not all(
        c.isascii() and _COUNTRY.fullmatch(c) for c in codes
    ):
        return None
    return frozenset(codes)


def _jurisdictions(asked: frozenset[str], grant: KeyGrant | None) -> frozenset[str] | None:
    """The request's residency: the header's codes within the key's (None: it asks for one
    the key may not use)."""
    if grant is None:
        return asked  # no key's own: what the header asks (usually nothing)
    own = grant.jurisdictions
    if asked and own:
        return asked if asked <= own else None
    return asked or own


def _upstream_headers(
    head: RequestHead, tier: int, plane_key: str | None
) -> list[tuple[bytes, bytes]]:
    out = [(n, v) for n, v in head.forward if n not in _EXTRA]
    out.append((b"x-priority", str(tier).encode()))
    if plane_key:
        out.append((b"authorization", b"Bearer " + plane_key.encode()))
    return out


def _event_stream(resp: Response) -> bool:
    """The plane answers with SSE events: not every ``stream: true`` gets them (embeddings
    never stream; engines answer them in JSON, which the event relay would have dropped)."""
    return any(
        name == b"content-type" and value.startswith(b"text/event-stream")
        for name, value in resp.headers
    )


def _crosses(choice: Choice, ranked: Ranked) -> bool:
    """The answer leaves the plane's region for the client's (both known)."""
    return bool(choice.client_region and ranked.region) and choice.client_region != ranked.region


def _refusal(choice: Choice) -> str:
    return choice.refusal or f"no plane of deployment {choice.deployment} can serve"


def _describe(choice: Choice, state: GatewayState) -> dict[str, Any]:
    table = state.table
    return {
        "deployment": choice.deployment,
        "gateway_region": state.region,
        "table_version": list(table.version) if table is not None else None,
        "reports_flowing": state.reports_flowing(state.clock()),
        "allowed_jurisdictions": sorted(choice.allowed),
        "ranking": [
            {
                "plane": r.cluster,
                "endpoint": r.endpoint,
                "role": r.role,
                "expected_ttft_ms": round(r.expected_s * 1000, 2),
                "network_ms": round(r.network_s * 1000, 2),
                "queue_ms": round(r.queue_s * 1000, 2),
                "cold_ms": round(r.cold_s * 1000, 2),
                "saturated": r.saturated,
                "why": r.why,
            }
            for r in choice.ranked
        ],
        "excluded": [{"plane": c, "why": w} for c, w in choice.excluded],
        "refusal": choice.refusal,
    }
