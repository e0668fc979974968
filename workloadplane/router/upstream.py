"""A minimal HTTP/1.1 client for talking to replicas: keep-alive pool, streamed bodies.

Written on asyncio protocols and httptools (as is the router's own server) because the router's
added latency is a target: a general-purpose client costs several times more per request.
It knows exactly whether any byte of the response arrived, which is what makes a retry on
another replica safe (``UpstreamError.before_first_byte``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol
from urllib.parse import urlsplit

import httptools

Headers = Sequence[tuple[bytes, bytes]]

HIGH_WATER = 1 << 20
"""Bytes of a response body held for a reader that awaits ``body()`` (the task path) above
which the connection stops reading from the upstream until the reader has taken them: a
client slower than its replica bounds the memory a response holds, not the replica."""

READ_LIMIT = 8 << 20
"""Most bytes ``Response.read`` takes (health, load, model list, a replica's metrics)."""

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
"""A response head larger (or with more headers) fails as a bad response (as the router's
own server bounds what clients send): an upstream that sends a head without end must not
fill the router's or gateway's memory."""


class UpstreamError(Exception):
    """The replica failed this request; ``before_first_byte``: nothing of a response came."""

    def __init__(self, message: str, *, before_first_byte: bool) -> None:
        super().__init__(message)
        self.before_first_byte = before_first_byte


class HeadTooLarge(Exception):
    """A response head over ``MAX_HEAD_BYTES`` or ``MAX_HEADERS``."""


class UpstreamAborted(UpstreamError):
    """The caller aborted the exchange (``abort``, or the head deadline) before its head came."""

    def __init__(self, message: str) -> None:
        super().__init__(message, before_first_byte=True)


class HeadTimeout(UpstreamAborted):
    """The head deadline passed: the replica may only be slow to begin (a long prompt's
    preprocessing, a busy API loop), not dead — the probes say that."""


Abort = Callable[[str], None]


class Listener(Protocol):
    """Takes an exchange's response from the connection's callbacks (``Connection.relay``):
    no task, no future. Exactly one of ``on_end`` and ``on_error`` ends it."""

    def on_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    def on_chunk(self, chunk: bytes) -> None: ...

    def on_read(self) -> None:
        """After each read from the socket (its chunks were handed over)."""

    def on_end(self) -> None: ...

    def on_error(self, exc: UpstreamError) -> None: ...


def _until_close(status: int, headers: Headers) -> bool:
    """Whether a response's body runs until the connection closes: no Content-Length,
    no chunked Transfer-Encoding, and a status that has a body (RFC 9112 6.3)."""
    if status in (204, 304):
        return False
    for name, value in headers:
        if name == b"content-length" or (
            name == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            return False
    return True


def host_port(endpoint: str) -> tuple[str, int]:
    """``http://host:port/...`` → (host, port): the scheme's port when it names none (a
    URL type drops ``:80``), an IPv6 host without its brackets. Raises ValueError when the
    port is not a number from 0 to 65535."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = parts.port  # the ValueError
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return parts.hostname or "127.0.0.1", port


class Connection(asyncio.Protocol):
    """One keep-alive connection to the upstream: an exchange is awaited (``begin``, then
    ``body``) or handed to a ``Listener`` (``relay``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self._head: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0  # bytes in _chunks
        self._paused = False  # reading paused: _held went over HIGH_WATER
        self._wake: asyncio.Future[None] | None = None
        self._done = False
        self._keep_alive = False
        self._error: Exception | None = None
        self._got_bytes = False
        self._aborted: str | None = None  # aborted while still connecting
        self._connecting: asyncio.Task[object] | None = None
        self._listener: Listener | None = None
        self._head_came = False
        self._head_bytes = 0  # read of this response while its head had not come
        self._trailer_bytes = 0
        self._interim = False  # a 1xx head came: its final answer is still to come
        self._extra = False  # bytes came after the answer: the connection is not reused
        self._until_close = False  # the body has no length: it ends when the upstream closes
        self._idle_s = 0.0  # watch_idle: the body is cut after this long without a byte
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0  # loop time of the last bytes, while the idle watch runs

    # --- protocol callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._done and exc is None and self._head_came and self._until_close:
            self.on_message_complete()  # a body delimited by the close (RFC 9112 6.3, 8)
            return
        if not self._done and self._error is None:  # a cut's reason stays the reason
            self._fail(
                UpstreamError(
                    f"connection lost: {exc or 'closed by replica'}",
                    before_first_byte=not self._got_bytes,
                )
            )

    def data_received(self, data: bytes) -> None:
        if self._idle_timer is not None:  # one clock read per read: the timer is not reset
            self._last_data = asyncio.get_running_loop().time()
        if self._done:  # bytes nobody asked for (an idle connection, or after the answer):
            self._extra = True  # whatever they are, they are no answer to the next request
            self.close()
            return
        self._got_bytes = True
        try:
            self.parser.feed_data(data)
            if not self._head_came:
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    raise httptools.HttpParserError(
                        HeadTooLarge(f"head over {MAX_HEAD_BYTES} bytes")
                    )
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("the upstream switched protocols", before_first_byte=False))
            self.close()
        except httptools.HttpParserError as exc:
            why = exc.__context__ if isinstance(exc.__context__, HeadTooLarge) else exc
            self._fail(UpstreamError(f"bad response: {why}", before_first_byte=False))
            if self.transport is not None:
                self.transport.close()
        if self._extra:  # a second message after the answer in the same read
            self.close()
        if self._listener is not None:
            self._listener.on_read()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_came or self._done:  # a chunked body's trailer, or a message after
            self._trailer_bytes += len(name) + len(value)  # the answer: never its headers
            if self._trailer_bytes > MAX_HEAD_BYTES:
                raise HeadTooLarge(f"trailers over {MAX_HEAD_BYTES} bytes")
            return
        if len(self.headers) >= MAX_HEADERS:
            raise HeadTooLarge(f"more than {MAX_HEADERS} headers")  # httptools wraps it
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._done:
            self._extra = True
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the
            self._interim = True  # final one follows on the same connection
            self.headers = []
            return
        self.status = status
        self._head_came = True
        self._until_close = _until_close(status, self.headers)
        if self._listener is not None:
            self._listener.on_head(self.status, self.headers)
        elif self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._done:
            self._extra = True
            return
        if self._listener is not None:
            self._listener.on_chunk(body)
            return
        self._chunks.append(body)
        self._held += len(body)
        if self._held > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._done:
            self._extra = True
            return
        # read it now: llhttp resets its flags once the message is complete, after which
        # should_keep_alive() is False for every response (each request paid a new connection)
        self._keep_alive = self.parser.should_keep_alive()
        self._done = True
        self._stop_idle()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.on_end()
            return
        self._notify()

    # --- helpers ------------------------------------------------------------------------
    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        self._error = exc
        self._stop_idle()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.on_error(exc)
            return
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        self._notify()

    def abort(self, reason: str) -> None:
        """Fail the exchange waiting for its head and close the connection (the replica
        sees the client go); no-op once the head came. Before ``begin`` (connecting), the
        exchange fails at once (a silent host never completes the connect) or as it begins."""
        self._abort(UpstreamAborted(reason))

    def time_out(self, reason: str) -> None:
        """``abort`` for the head deadline: the exchange fails with ``HeadTimeout``."""
        self._abort(HeadTimeout(reason))

    def _abort(self, error: UpstreamAborted) -> None:
        if self._listener is not None:
            if not self._head_came:
                self._fail(error)
                self.close()
        elif self._head is None:
            self._aborted = str(error)
            if self._connecting is not None:
                self._connecting.cancel()
        elif not self._head.done():
            self._fail(error)
            self.close()

    def watch_idle(self, seconds: float) -> None:
        """Cut the body (``cut``) once the upstream sends nothing for ``seconds`` while we
        read: a replica whose stream stalls (its /health fine) held the request and its
        client for good. Time the reading is paused by our own back-pressure (a slow
        client) does not count."""
        if self._done or self.closed or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        self._idle_s, self._last_data = seconds, loop.time()
        self._idle_timer = loop.call_later(seconds, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self._done or self.closed:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._paused:  # we stopped reading, not the upstream sending
            self._last_data = now
        left = self._last_data + self._idle_s - now
        if left > 0:
            self._idle_timer = loop.call_later(left, self._idle_check)
            return
        self.cut(f"the replica sent nothing for {self._idle_s:g}s")

    def _stop_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def cut(self, reason: str) -> None:
        """End a response whose head came but whose body has not: its reader gets
        ``UpstreamError`` (bytes came: no retry) and the connection is closed."""
        came = (
            self._head_came
            if self._listener is not None
            else self._head is not None and self._head.done()
        )
        if came and not self._done and not self.closed:
            self._fail(UpstreamError(reason, before_first_byte=False))
            self.close()

    async def connect(self, host: str, port: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_task(loop.create_connection(lambda: self, host, port))
        try:
            await asyncio.wait_for(self._connecting, timeout)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(
                f"connect to {host}:{port} failed: {exc!r}", before_first_byte=True
            ) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._aborted is None or (task is not None and task.cancelling()):
                raise  # our caller was cancelled, not the exchange aborted
            raise UpstreamAborted(self._aborted) from None
        finally:
            self._connecting = None

    def _reset(self) -> None:
        self.headers, self.status, self._chunks = [], 0, collections.deque()
        self._held = 0
        if self._paused:
            self._paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
        self._done, self._keep_alive, self._error, self._got_bytes = False, False, None, False
        self._head_came = False
        self._head_bytes = self._trailer_bytes = 0
        self._interim = False
        self._until_close = False

    def relay(self, request: bytes, listener: Listener) -> None:
        """Send ``request`` (an idle connection's, from ``UpstreamPool.take_idle``); the
        response goes to ``listener`` as it arrives. ``abort`` and ``cut`` work as for
        ``begin``; give the connection back with ``UpstreamPool.put_back`` once it ended
        and is ``reusable``."""
        assert self.transport is not None
        self._reset()
        self._head = None
        self._listener = listener
        self.transport.write(request)

    def begin(self, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self._reset()
        self._head = asyncio.get_running_loop().create_future()
        if self._aborted is not None:
            self._fail(UpstreamAborted(self._aborted))
            self.close()
            return self._head
        self.transport.write(request)
        return self._head

    async def body(self) -> AsyncIterator[bytes]:
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._held -= len(chunk)
                if self._paused and self._held <= HIGH_WATER // 2:
                    self._paused = False
                    if self.transport is not None and not self.closed:
                        self.transport.resume_reading()
                yield chunk
            if self._done:
                return
            if self._error is not None:
                raise self._error
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
            self._wake = None

    def whole(self) -> bytes | None:
        """The rest of the body if all of it has arrived (else None: iterate ``body()``)."""
        if not self._done or self._error is not None:
            return None
        self._held = 0
        if len(self._chunks) == 1:
            return self._chunks.popleft()
        rest = b"".join(self._chunks)
        self._chunks.clear()
        return rest

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        return self._done and self._keep_alive and not self.closed and not self._extra

    def close(self) -> None:
        self._stop_idle()
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class Response:
    """An upstream response whose head has arrived; iterate ``body()`` then ``release()``."""

    def __init__(self, pool: UpstreamPool, conn: Connection) -> None:
        self._pool, self._conn = pool, conn
        self._released = False
        self.status = conn.status
        self.headers = conn.headers

    def body(self) -> AsyncIterator[bytes]:
        return self._conn.body()

    def whole(self) -> bytes | None:
        """The body, if all of it has already arrived (else None: iterate ``body()``); the
        usual case of a short answer, whose head and body come in one read."""
        return self._conn.whole()

    async def read(self, limit: int = READ_LIMIT) -> bytes:
        """The whole body; over ``limit`` bytes the connection is closed and UpstreamError
        raised (a health, load or metrics answer is small: a replica that sends without
        end must not fill the router's memory)."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in self._conn.body():
            size += len(chunk)
            if size > limit:
                self.discard()
                raise UpstreamError(f"response body over {limit} bytes", before_first_byte=False)
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_within(self, timeout: float, limit: int = READ_LIMIT) -> bytes:
        """``read`` bounded in time, then ``release``: a body that stalls (TimeoutError) or
        is too long closes its connection rather than leak it or give it back half read."""
        try:
            return await asyncio.wait_for(self.read(limit), timeout)
        finally:
            self.release()

    def watch_idle(self, seconds: float) -> None:
        """The body is cut after ``seconds`` without a byte from the replica
        (``Connection.watch_idle``)."""
        self._conn.watch_idle(seconds)

    def cut(self, reason: str) -> None:
        """End the body now (the replica stopped sending): ``body()`` raises UpstreamError.
        Nothing once released: the connection may be back in the pool, carrying another
        request's answer (a late cut, e.g. the client of a stream already continued
        elsewhere leaving, broke that other request)."""
        if not self._released:
            self._conn.cut(reason)

    def discard(self) -> None:
        """Close the connection without reading the body: the response is not wanted."""
        self._released = True
        self._conn.close()

    def release(self) -> None:
        """Give the connection back if the response was read to the end, else close it.
        Once: a second call does nothing."""
        if self._released:
            return
        self._released = True
        if self._conn.reusable:
            self._pool.put_back(self._conn)
        else:
            self._conn.close()


class UpstreamPool:
    """Keep-alive connections to one replica (``host:port``)."""

    def __init__(self, host: str, port: int, *, max_idle: int = 256) -> None:
        self.host, self.port, self.max_idle = host, port, max_idle
        self._idle: list[Connection] = []
        self.connections_opened = 0
        """New connections made so far (keep-alive works when this stays low)."""
        self._host_header = f"{host}:{port}".encode()

    def take_idle(self) -> Connection | None:
        """A kept-alive connection for ``Connection.relay`` (None: none is idle)."""
        while self._idle:
            conn = self._idle.pop()
            transport = conn.transport
            if not conn.closed and transport is not None and not transport.is_closing():
                return conn
        return None

    def put_back(self, conn: Connection) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def encode(self, method: str, path: str, headers: Headers, body: bytes) -> bytes:
        lines = [f"{method} {path} HTTP/1.1\r\n".encode(), b"host: ", self._host_header, b"\r\n"]
        for name, value in headers:
            lines += [name, b": ", value, b"\r\n"]
        if body or method == "POST":
            lines.append(b"content-length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        lines.append(body)
        return b"".join(lines)

    async def request(
        self,
        method: str,
        path: str,
        headers: Headers = (),
        body: bytes = b"",
        *,
        head_timeout: float | None = None,
        connect_timeout: float = 2.0,
        on_abortable: Callable[[Abort], None] | None = None,
    ) -> Response:
        """Send a request; return once the response head arrived (or raise UpstreamError).

        ``on_abortable`` gets a function that aborts the exchange before its head came
        (``UpstreamAborted``): the connection is closed, no task is needed to cancel it."""
        raw = self.encode(method, path, headers, body)
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, raw, head_timeout, on_abortable)
            except UpstreamAborted:
                raise
            except UpstreamError as exc:
                if not exc.before_first_byte:
                    raise
                # a keep-alive connection the replica had closed: try a fresh one
        conn = Connection()
        self.connections_opened += 1
        if on_abortable is not None:  # also while connecting: ejection must reach it
            on_abortable(conn.abort)
        await conn.connect(self.host, self.port, connect_timeout)
        return await self._exchange(conn, raw, head_timeout, on_abortable)

    async def _exchange(
        self,
        conn: Connection,
        raw: bytes,
        head_timeout: float | None,
        on_abortable: Callable[[Abort], None] | None,
    ) -> Response:
        head = conn.begin(raw)
        if on_abortable is not None:
            on_abortable(conn.abort)
        timer = None
        if head_timeout is not None:
            timer = asyncio.get_running_loop().call_later(
                head_timeout, conn.time_out, f"no response within {head_timeout}s"
            )
        try:
            await head
        except BaseException:
            conn.close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return Response(self, conn)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
