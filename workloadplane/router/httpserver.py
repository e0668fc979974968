"""The router's HTTP/1.1 server: an asyncio protocol on httptools running one ASGI app.

Lighter than a general ASGI server on the path that counts (the router's added latency):
no middleware, one task per request, and the response head is held back and written with
the first body message, so a small response costs one ``write``. An app that wants the
head out before any body (SSE) sends an empty body message with ``more_body`` right after
``http.response.start``; under other ASGI servers that message is a no-op.

Per connection one request runs at a time; pipelined ones wait, answered in order.

A server may also take a ``fast`` handler: called for each request before any task is made,
it may answer the request itself from callbacks (``Connection.emit``, then ``done``: no task,
no awaits — the gateway relays a plane's answer this way) or ``hand_over`` to a coroutine,
which then runs as the app would; ``None`` runs the app.
``receive()`` returns the whole body first, then waits until the client disconnects
(``http.disconnect``). Sends after a disconnect are dropped.

``Limits`` bound what a client may send, checked while reading (before the app runs): a
declared ``content-length`` or a body (chunked too) above ``max_body_bytes`` gets 413, more
than ``max_headers`` headers or ``max_header_bytes`` of request line + headers get 431, each
an OpenAI-shaped error naming the limit; the response is written, the sending side shut,
the rest of the upload discarded, then the connection closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

import httptools

from workloadplane.router import errors

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_STATUS = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in http.HTTPStatus}
_DISCONNECT: Message = {"type": "http.disconnect"}
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n"
    b"connection: close\r\n\r\nbad request"
)
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 41\r\n"
    b"connection: close\r\n\r\nthe request did not arrive whole in time\n"
)
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 21\r\n"
    b"connection: close\r\n\r\ntoo many connections\n"
)
_SERVER_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\ninternal server error"
)

_DISCARD_FOR_S = 5.0
"""After a rejection, how long the rest of an upload is read and dropped before closing (so
the client reads the answer instead of a reset)."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int | None = None
    max_headers: int | None = None
    max_header_bytes: int | None = None
    server: str = "router"
    """What the limit messages call this server ("router" or "gateway"): the 413 names
    that command's --max-body-bytes."""
    write_stall_s: float = 120.0
    """A client that reads nothing of its answer this long (its side full) is cut off: it
    held the exchange, its upstream connection and the engine's work for good."""
    read_request_s: float = 60.0
    """A request not whole this long after its first byte is answered 408 and its
    connection closed (checked by the idle sweep): a client trickling a byte now and then
    held its connection and the body read so far for good."""
    max_connections: int = 10_000
    """Connections beyond this are closed as they come (with a 503)."""


class Exchange(Protocol):
    """A request a ``fast`` handler answers from callbacks."""

    def client_gone(self) -> None:
        """The client's connection closed before ``Connection.done``."""

    def resume(self) -> None:
        """The client's connection drained after ``Connection.emit`` said it was full."""


Handler = Callable[[Receive, Send], Awaitable[None]]
Fast = Callable[[Scope, bytes, "Connection"], "Exchange | None"]


class _Deciding:
    def client_gone(self) -> None:
        pass

    def resume(self) -> None:
        pass


_DECIDING = _Deciding()


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing a request that broke a limit."""


def _rejection(status: int, reason: str, message: str, code: str) -> bytes:
    body = errors.error_body(message, "invalid_request_error", code)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def _address(name: object) -> tuple[str, int] | None:
    """(host, port) of a socket address; None for a Unix socket's or none."""
    if isinstance(name, tuple) and len(name) >= 2:
        return str(name[0]), int(name[1])
    return None


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs the app for each, writes responses."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.seen = True  # data arrived since the last idle sweep
        self.task: asyncio.Task[None] | None = None
        self.exchange: Exchange | None = None
        """The request a ``fast`` handler is answering from callbacks."""
        self._scope_now: Scope = {}
        self.pending: collections.deque[tuple[Scope, bytes, bool]] = collections.deque()
        # the request being parsed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._scope: Scope | None = None
        self._scope_built = False  # the head is parsed: what the parser reads now is body
        self.reading_since: float | None = None
        """``loop.time()`` of the first byte of a request not yet whole (None: none)."""
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        """The peer's and this end's (host, port): ASGI's ``client`` and ``server``."""
        self._keep_alive_parsed = True
        self._header_count = 0
        self._header_bytes = 0
        self._body_bytes = 0
        self._rejection: bytes | None = None
        self._discarding = False
        # the request being answered
        self._request_body = b""
        self._body_taken = False
        self._keep_alive = True
        self._head_only = False
        self._head = b""
        self._started = False
        self._finished = False
        self._chunked = False
        self._http10 = False
        self._reading_paused = False
        self._continue_owed = False
        self._gone: asyncio.Future[None] | None = None
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._stall: asyncio.TimerHandle | None = None

    # --- transport callbacks ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.server.limits.max_connections:
            self.abort(_BUSY)
            return
        self.server.connections.add(self)
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self.server.connections.discard(self)
        self.pending.clear()
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        self._resume_writing()
        if self.exchange is not None:
            exchange, self.exchange = self.exchange, None
            exchange.client_gone()

    def data_received(self, data: bytes) -> None:
        self.seen = True
        if self._discarding or self._rejection is not None:
            return  # the rest of a rejected upload
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # no upgrades here (h2c, websocket): answer in HTTP/1.1, then close, as the
            # parser stops after an upgrade request
            if self.pending:
                scope, body, _ = self.pending.pop()
                self.pending.append((scope, body, False))
            elif self.busy:
                self._keep_alive = False
            else:
                self.abort(_BAD_REQUEST)
        except httptools.HttpParserError as exc:
            if not isinstance(exc.__context__, _Rejected) and (self.busy or self.pending):
                # bytes that are no request after ones being answered (or after a request
                # that closes the connection): answer those first, then the 400
                self._rejection = self._rejection or _BAD_REQUEST
            if self._rejection is not None:
                if not self.busy and not self.pending:
                    self._reject_now()
                elif self.transport is not None and not self._reading_paused:
                    self._reading_paused = True  # answered once the requests before it are
                    self.transport.pause_reading()
                return
            self.abort(_BAD_REQUEST)

    def pause_writing(self) -> None:
        self._paused = True
        if self._stall is None:
            self._stall = self.loop.call_later(self.server.limits.write_stall_s, self._stalled)

    def resume_writing(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._resume_writing()

    # --- parser callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.reading_since = self.loop.time()
        self._url, self._headers, self._body = b"", [], []
        self._scope_built = False
        self._header_count, self._header_bytes, self._body_bytes = 0, 0, 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._scope_built:  # a chunked body's trailer: never a header of the request,
            self._count_head(len(name) + len(value) + 4)  # but bounded with the head
            return
        self._headers.append((name.lower(), value))
        self._header_count += 1
        limit = self.limits.max_headers
        if limit is not None and self._header_count > limit:
            message = (
                f"the request has more than {limit} headers, the most this "
                f"{self.limits.server} takes: send fewer headers"
            )
            self._reject(431, "Request Header Fields Too Large", message, "too_many_headers")
        self._count_head(len(name) + len(value) + 4)

    def _count_head(self, n: int) -> None:
        self._header_bytes += n
        limit = self.limits.max_header_bytes
        if limit is not None and self._header_bytes > limit:
            message = (
                f"the request line and headers exceed {_size(limit)}, the most this "
                f"{self.limits.server} takes: send fewer or shorter headers"
            )
            self._reject(431, "Request Header Fields Too Large", message, "headers_too_large")

    def _reject_body(self, size: str) -> None:
        limit = self.limits.max_body_bytes
        assert limit is not None
        who = self.limits.server
        message = (
            f"the request body ({size}) exceeds this {who}'s limit of {_size(limit)} "
            f"({limit} bytes): send a shorter prompt, or raise the {who}'s --max-body-bytes"
        )
        self._reject(413, "Content Too Large", message, "request_too_large")

    def _reject(self, status: int, reason: str, message: str, code: str) -> None:
        self._rejection = _rejection(status, reason, message, code)
        raise _Rejected

    def _reject_now(self) -> None:
        """Answer the rejection, shut our side, drop what the client still sends, close."""
        assert self._rejection is not None
        response, self._rejection = self._rejection, None
        self._discarding = True
        transport = self.transport
        if transport is None or self.closed:
            return
        transport.write(response)
        if transport.can_write_eof():
            transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self.loop.call_later(_DISCARD_FOR_S, self.abort, b"")

    def on_headers_complete(self) -> None:
        self._scope_built = True
        raw_path, _, query = self._url.partition(b"?")
        path = raw_path.decode("latin-1")
        self._scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": self.parser.get_http_version(),
            "scheme": "http",
            "method": self.parser.get_method().decode("ascii"),
            "path": unquote(path) if "%" in path else path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": self._headers,
            "server": self.local,
            "client": self.client,
        }
        self._keep_alive_parsed = self.parser.should_keep_alive()
        if self._scope["http_version"] == "1.0" and any(
            n == b"transfer-encoding" for n, _ in self._headers
        ):  # RFC 9112 6.1: its framing is not to be trusted: answer it, then close
            self._keep_alive_parsed = False
        limit = self.limits.max_body_bytes
        if limit is not None:
            for name, value in self._headers:
                if name != b"content-length":
                    continue
                declared = value.strip()  # int() reads 4,300 digits at most
                if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
                    self._reject_body(f"content-length {declared[:24].decode()}")
        if any(n == b"expect" and v.strip().lower() == b"100-continue" for n, v in self._headers):
            self._continue_owed = True  # sent once every response before it went out
            self._send_continue()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        limit = self.limits.max_body_bytes
        if limit is not None and self._body_bytes > limit:
            self._body = []
            self._reject_body(f"more than {limit} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._scope is not None
        self.reading_since = None
        self._continue_owed = False  # the body came anyway
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = (self._scope, body, self._keep_alive_parsed)
        self._scope = None
        if not self.busy:
            self._start(*request)
        else:  # pipelined: answer in order, and read no further meanwhile
            self.pending.append(request)
            if self.transport is not None and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()

    # --- one request ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A request is being answered (by a task or from callbacks)."""
        return self.task is not None or self.exchange is not None

    def _start(self, scope: Scope, body: bytes, keep_alive: bool) -> None:
        self._request_body, self._body_taken = body, False
        self._keep_alive, self._head_only = keep_alive, scope["method"] == "HEAD"
        self._http10 = scope["http_version"] == "1.0"
        self._head, self._started, self._finished = b"", False, False
        self._scope_now = scope
        fast = self.server.fast
        if fast is not None:
            self.exchange = _DECIDING  # busy while the handler decides
            try:
                exchange = fast(scope, body, self)
            except Exception:
                log.exception("router app failed on %s %s", scope["method"], scope["path"])
                exchange = None
                self.done()
            if self.exchange is not _DECIDING:
                return  # handed over, or answered (and maybe the next one started)
            self.exchange = exchange
            if exchange is not None:
                return
        self.task = self.loop.create_task(self._run(scope))

    def hand_over(self, handler: Handler) -> None:
        """From a ``fast`` handler (or its exchange, before it emitted anything): answer
        the request with ``handler`` as a task, as the app would. The fast handler had the
        body: the handler's ``receive`` only says when the client disconnects."""
        self.exchange = None
        self._body_taken, self._request_body = True, b""
        self.task = self.loop.create_task(self._run(self._scope_now, handler))

    def done(self) -> None:
        """From a ``fast`` exchange, once its whole response was emitted (or it aborted)."""
        self.exchange = None
        if self.task is None:
            self._after()

    async def _run(self, scope: Scope, handler: Handler | None = None) -> None:
        try:
            if handler is None:
                await self.server.app(scope, self.receive, self.send)
            else:
                await handler(self.receive, self.send)
        except errors.ResponseCut as exc:  # _after closes the connection
            log.warning("%s %s: %s", scope["method"], scope["path"], exc)
        except Exception:
            log.exception("router app failed on %s %s", scope["method"], scope["path"])
        self.task = None
        self._after()

    def _after(self) -> None:
        """A request was answered (or failed): the next one, or what waited on it."""
        if not self._finished and not self.closed:  # failed, or no whole response
            scope = self._scope_now
            log.error("no whole response to %s %s", scope["method"], scope["path"])
            wrote = self._started and not self._head
            self.abort(b"" if wrote else _SERVER_ERROR)
        if self.closed:
            return
        if self.pending:
            self._start(*self.pending.popleft())
            return
        if self._rejection is not None:
            self._reject_now()
            return
        self._send_continue()
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    async def receive(self) -> Message:
        if not self._body_taken:
            self._body_taken = True
            body, self._request_body = self._request_body, b""
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.closed:
            if self._gone is None or self._gone.done():
                self._gone = self.loop.create_future()
            await self._gone
        return _DISCONNECT

    async def send(self, message: Message) -> None:
        if self.emit(message):
            await self._wait_drained()

    def emit(self, message: Message) -> bool:
        """``send`` without waiting: True when the client's side is full (wait for
        ``Exchange.resume`` before emitting more)."""
        kind = message["type"]
        if kind == "http.response.start":
            self._head = self._encode_head(message)
            self._started = True
            return False
        if kind != "http.response.body":
            return False
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        out, self._head = self._head, b""
        if self._head_only:
            pass
        elif self._chunked:
            if body:
                out += b"%x\r\n%b\r\n" % (len(body), body)
            if not more:
                out += b"0\r\n\r\n"
        elif body:
            out = out + body if out else body
        if self.closed or self.transport is None:
            self._finished = self._finished or not more
            return False
        if out:
            self.transport.write(out)
        if not more:
            self._finished = True
            if not self._keep_alive:
                self.transport.close()
            return False
        return self._paused

    def _encode_head(self, message: Message) -> bytes:
        status: int = message["status"]
        parts = [_STATUS.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status]
        chunked = True
        for name, value in message.get("headers", ()):
            if name == b"content-length":
                chunked = False
            parts += (name, b": ", value, b"\r\n")
        if chunked and self._http10:  # an HTTP/1.0 client reads no chunks: the body
            chunked, self._keep_alive = False, False  # as it comes, ended by the close
        elif chunked and status >= 200 and status not in (204, 304):
            parts.append(b"transfer-encoding: chunked\r\n")
        else:
            chunked = False
        if not self._keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self._chunked = chunked
        return b"".join(parts)

    # --- helpers ----------------------------------------------------------------------------
    def _send_continue(self) -> None:
        if self._continue_owed and not self.busy and not self.pending and self.transport:
            self._continue_owed = False
            self.transport.write(_CONTINUE)

    def abort(self, response: bytes) -> None:
        """Write ``response`` (if any) and close the connection now."""
        if self.transport is not None and not self.closed:
            if response:
                self.transport.write(response)
            self.transport.close()
        self.closed = True

    def _resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self.exchange is not None and not self.closed:
            self.exchange.resume()

    async def _wait_drained(self) -> None:
        self._drained = self.loop.create_future()
        await self._drained

    def _stalled(self) -> None:
        """The client read nothing for ``write_stall_s`` with its side full: cut it off
        (abort, not close: close waits to flush what it will never read); the exchange
        sees it gone, as on any disconnect."""
        self._stall = None
        if self._paused and self.transport is not None and not self.closed:
            self.transport.abort()

    def close_if_idle(self) -> bool:
        if not self.busy and not self.pending:
            self.abort(b"")
            return True
        return False


class HttpServer:
    """Serves ``app`` on ``host:port``; idle keep-alive connections close after
    ``keep_alive_s`` to ``2 × keep_alive_s``."""

    def __init__(
        self,
        app: App,
        *,
        keep_alive_s: float = 15.0,
        limits: Limits | None = None,
        fast: Fast | None = None,
    ) -> None:
        self.app = app
        self.fast = fast
        self.keep_alive_s = keep_alive_s
        self.limits = limits or Limits()
        self.connections: set[Connection] = set()
        self.loop: asyncio.AbstractEventLoop  # set by start()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: Connection(self), host, port, backlog=4096, reuse_address=True
        )
        self._sweeper = self.loop.create_task(self._sweep(), name="router-http-idle")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(self.keep_alive_s, self.limits.read_request_s))
            now = self.loop.time()
            for conn in list(self.connections):
                began = conn.reading_since
                late = began is not None and now - began >= self.limits.read_request_s
                if late and not conn.busy:  # (a busy one answers first; it reads no more)
                    conn.abort(_TIMEOUT)
                elif not conn.seen:
                    conn.close_if_idle()
                conn.seen = False

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop listening, close idle connections, give running requests ``grace_s``."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_if_idle()
        deadline = self.loop.time() + grace_s
        while any(c.exchange is not None for c in self.connections):
            if self.loop.time() >= deadline:
                break
            await asyncio.sleep(0.01)  # exchanges answered from callbacks: nothing to await
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*late, return_exceptions=True)
        for conn in list(self.connections):
            conn.abort(b"")
