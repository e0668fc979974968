"""The OpenAI front shared by the plane's router and the gateway: reading a request (body,
request id, API key and tier, ``model``), relaying an upstream response chunk by chunk, and
the small ASGI helpers. HTTP only; what to send where is the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from controlplane.contracts import loads, whole_number
from gpufleet_logging import clean_request_id
from workloadplane.router import errors
from workloadplane.router.keys import hash_key
from workloadplane.router.upstream import Response, UpstreamError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
G = TypeVar("G")
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

INFERENCE_PATHS = {b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"}
DROP_REQUEST = {
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
    b"x-request-id",  # sent on clean, see read_head
}
DROP_RESPONSE = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"date",
    b"server",
    b"x-request-id",
}
_TIERS = {"high": 0, "normal": 1, "low": 2}
_random_bits = random.getrandbits
FLUSH = {"type": "http.response.body", "body": b"", "more_body": True}


class ClientGoneError(Exception):
    """The client went away while its request waited or streamed."""


@dataclass(slots=True)
class RequestHead:
    """What the front reads of a request's headers."""

    request_id: bytes
    """The client's X-Request-Id, cleaned (printable ASCII, at most 64), or a new one."""
    auth: bytes
    priority: bytes
    forward: list[tuple[bytes, bytes]]
    """Headers to send upstream (hop-by-hop, auth and priority dropped; X-Request-Id set to
    ``request_id``, so every hop behind logs the same id)."""
    wanted: dict[bytes, bytes]
    """The values of the ``extra`` header names the caller asked for (a name sent more
    than once: its values joined by commas, as HTTP defines)."""


def read_head(
    headers: list[tuple[bytes, bytes]], extra: frozenset[bytes] = frozenset()
) -> RequestHead:
    request_id, auth, priority = b"", b"", b""
    fwd: list[tuple[bytes, bytes]] = []
    wanted: dict[bytes, bytes] = {}
    for name, value in headers:
        if name == b"x-request-id":
            request_id = value
        elif name == b"authorization":
            auth = value
        elif name == b"x-priority":
            priority = value
        elif name in extra:  # a field sent twice is one comma-joined list (RFC 9110 5.3)
            wanted[name] = wanted[name] + b"," + value if name in wanted else value
        if name not in DROP_REQUEST:
            fwd.append((name, value))
    clean = clean_request_id(request_id) if request_id else None
    # none from the client: a new one, unique, needn't be secret
    request_id = clean.encode() if clean else b"%032x" % _random_bits(128)
    fwd.append((b"x-request-id", request_id))
    return RequestHead(request_id, auth, priority, fwd, wanted)


def bearer(auth: bytes) -> str:
    """The token of ``Bearer <token>``; the whitespace HTTP allows around it is not part of
    it (httptools keeps a value's trailing blanks; keys have none)."""
    return auth[7:].strip().decode(errors="replace") if auth[:7].lower() == b"bearer " else ""


def grant_of(keys: Mapping[str, G], auth: bytes) -> G | None:
    """The grant of the request's bearer key among ``keys`` (by SHA-256 digest)."""
    return keys.get(hash_key(bearer(auth)))


def unknown_key(where: str) -> str:
    return f"invalid API key: send 'Authorization: Bearer <key>' with a key this {where} knows"


async def refuse_key(send: Send, head: RequestHead, where: str) -> None:
    """401 in OpenAI's shape, for a route other than inference (those count it too)."""
    status, type_ = errors.UNAUTHORIZED
    body = errors.error_body(unknown_key(where), type_, "invalid_api_key")
    await respond(send, status, body, extra=((b"x-request-id", head.request_id),))


def choose_tier(known: int | None, default: int, priority: bytes, tiers: int) -> int:
    """The key's tier (or ``default`` without keys), lowered by an ``X-Priority`` header,
    never raised."""
    tier = best = default if known is None else known
    if priority:
        asked = parse_tier(priority)
        if asked is not None:
            tier = max(asked, best)
    return min(max(tier, 0), tiers - 1)


class BadRequest(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def parse_payload(body: bytes) -> tuple[dict[str, Any], str]:
    """The JSON object and its ``model``, or ``BadRequest``."""
    try:
        payload = loads(body)
    except ValueError as exc:  # UnicodeDecodeError and too deep nesting included
        message = f"the body is not valid JSON ({exc}): send a JSON object with at least 'model'"
        raise BadRequest(message, "invalid_json") from exc
    model = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(model, str):
        message = "'model' is missing or not a string: name one of GET /v1/models"
        raise BadRequest(message, "missing_model")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        # the engine reads 1, "true", "yes" … as true (pydantic's lax bool): so do we, or
        # such a stream would be relayed as one JSON answer, without mid-stream failover
        key = stream.lower() if isinstance(stream, str) else stream
        flag = LAX_BOOL.get(key) if isinstance(key, (int, str)) else None
        if flag is None:
            raise BadRequest(
                f"'stream' must be true or false, not {stream!r:.40}", "invalid_stream"
            )
        payload["stream"] = flag
    return payload, model


LAX_BOOL: dict[object, bool] = {
    0: False, 1: True,
    **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False),
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
}  # fmt: skip
"""The values pydantic's lax mode (vLLM's request models) reads as a bool."""


@dataclass(slots=True)
class Relayed:
    size: int = 0
    events: int = 0
    first: float = 0.0
    tail: bytes = b""
    complete: bool = False


async def relay(
    resp: Response,
    stream: bool,
    send: Send,
    client: ClientWatch,
    headers: list[tuple[bytes, bytes]],
    what: str,
) -> Relayed:
    """Relay ``resp`` to the client as it arrives (``headers`` added to its own); a stream
    cut after its head ends with an OpenAI-shaped SSE error event and no ``[DONE]``.
    Raises ``ClientGoneError`` when the client left. ``what``: the upstream, for the log."""
    out = [(n, v) for n, v in resp.headers if n not in DROP_RESPONSE]
    out += headers
    head = {"type": "http.response.start", "status": resp.status, "headers": out}
    if not stream and (whole := resp.whole()) is not None:  # all here: one write, no loop
        await send(head)
        resp.release()
        size = len(whole)
        first = time.perf_counter() if size else 0.0
        await send({"type": "http.response.body", "body": whole, "more_body": False})
        if client.watching is not None and client.watching.done():
            raise ClientGoneError
        return Relayed(size, 0, first, whole if size <= 65536 else b"", True)
    gone = client.watching
    # a stream's head goes out now; any other's with its first chunk (one write): an answer
    # that breaks before it can still be answered whole, a 502 (it was a plain-text 500)
    held = not stream
    if stream:
        await send(head)
        await send(FLUSH)
        gone = client.gone()

    def client_left(_: object) -> None:  # a replica that stalls sends no chunk to look after
        resp.cut("the client went away")

    if gone is not None:
        gone.add_done_callback(client_left)
    r = Relayed()
    try:
        async for chunk in resp.body():
            if held:
                await send(head)
                held = False
            if not r.first:
                r.first = time.perf_counter()
            r.size += len(chunk)
            if stream:
                r.events += chunk.count(b"data: ")
                r.tail = chunk[-512:]
            elif r.size <= 65536:
                r.tail += chunk
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if gone is not None and gone.done():
                raise ClientGoneError
        r.complete = True
    except UpstreamError as exc:
        if gone is not None and gone.done():
            raise ClientGoneError from exc
        if held:  # nothing of it went out: the caller answers 502, counted
            raise UpstreamError(
                f"the replica's answer broke before its body ({exc})", before_first_byte=False
            ) from exc
        log.warning("%s: the stream broke after the first byte: %s", what, exc)
        if stream:  # no [DONE]: the client must not take a cut stream for a whole one
            await send_stream_error(
                send,
                f"the replica failed mid-stream ({exc}); the answer is incomplete: "
                "send the request again",
                "stream_broken",
            )
        else:  # its head (and content-length) may be out: only closing tells the client
            raise errors.ResponseCut(f"{what}: the answer broke after it began ({exc})") from exc
    finally:
        if gone is not None:
            gone.remove_done_callback(client_left)
        resp.release()
        if stream:
            client.close()
    if held:  # an empty body
        await send(head)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return r


async def send_stream_error(send: Send, message: str, code: str) -> None:
    error = errors.error_body(message, "upstream_error", code)
    chunk = b"data: " + error + b"\n\n"
    await send({"type": "http.response.body", "more_body": True, "body": chunk})


class ClientWatch:
    """The client's side of the connection: a watch for its disconnect, started on first
    need (the router's dispatcher starts it for every request: queued, at a replica, or
    streaming) and shared by all."""

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


def parse_tier(value: bytes) -> int | None:
    """``high``, ``normal``, ``low`` or a tier number; None (the header is ignored) for
    anything else: "²", a digit to ``isdigit`` and not to ``int``, or more digits than
    ``int`` reads (4,300) were a 500."""
    text = value.decode(errors="replace").strip().lower()
    if text in _TIERS:
        return _TIERS[text]
    return whole_number(text, 9)


async def read_body(receive: Receive) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


async def respond(
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


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
