"""The dispatcher: one request's way to a replica, and the one owner of the retry policy.

``Dispatcher.dispatch`` takes a replica slot (at once, or waiting in the deployment's
queue while the client is still there), sends the request, and decides: a connection
refused or reset, an abort (ejection, replica gone, the streaming head deadline) or a
502/503/504 **before any response byte** ejects that replica, releases its slot and retries
on another one (back at the head of its tier), up to ``max_attempts``; anything else is the
answer. Once a byte came (``Ticket.started``) nothing moves any more: the caller relays the
``Exchange`` and closes it, which releases the slot. Time comes from the router's clock.

The client is watched from the start: gone while its request waits in the queue or while a
replica works on it (a non-streaming head comes only when generation ends), the exchange is
aborted, the slot freed and ``ClientGoneError`` raised. All attempts together wait in the
queue until one deadline, ``queue_max_wait_s`` after the request came. A request waiting for
a rollout lane that loses its last replica, or leaves the desired set, goes on to the
deployment the lane serves (nothing was answered yet); one waiting for a deployment that
left gets ``DeploymentGoneError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workloadplane.router.core import Backend, DeploymentEntry, DeploymentGoneError, Router, Ticket
from workloadplane.router.front import ClientGoneError
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.upstream import Abort, HeadTimeout, Response, UpstreamError

__all__ = ["ClientGone", "ClientGoneError", "Dispatcher", "Exchange", "Forward"]

RETRYABLE_STATUS = frozenset({502, 503, 504})

ClientGone = Callable[[], "asyncio.Future[Any]"]
"""Returns a future that completes when the client disconnects (started on first call)."""


@dataclass(frozen=True, slots=True)
class Forward:
    """What is sent to the replica, untouched by retries."""

    path: str
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes
    stream: bool


class Exchange:
    """A replica's response whose head came: relay ``response``, then ``close()``."""

    def __init__(
        self,
        router: Router,
        entry: DeploymentEntry,
        backend: Backend,
        ticket: Ticket,
        resp: Response,
    ) -> None:
        self.response = resp
        self.replica_id = backend.replica_id
        self.deployment = entry.name
        """Whose answer it is (a lane's request may have moved to its deployment)."""
        self._router, self._backend, self._ticket = router, backend, ticket

    def close(self) -> None:
        """Give the connection back (or close it) and free the replica's slot."""
        try:
            self.response.release()
        finally:
            self._router.release(self._backend, self._ticket)


class Dispatcher:
    def __init__(self, router: Router, metrics: RouterMetrics) -> None:
        self.router = router
        self.metrics = metrics
        self.config = router.config

    async def dispatch(
        self, entry: DeploymentEntry, ticket: Ticket, request: Forward, client_gone: ClientGone
    ) -> Exchange:
        """The response to relay. Raises ``QueueFullError``, ``QueueTimeoutError``,
        ``NoCapacityError``, ``DeploymentGoneError`` (admission), ``ClientGoneError``, or the
        last ``UpstreamError`` when every attempt failed before a byte came."""
        gone = client_gone()
        deadline = self.router.clock() + self.config.queue_max_wait_s
        last_error: UpstreamError | None = None
        for attempt in range(self.config.max_attempts):
            entry, backend = await self._acquire(entry, ticket, gone, deadline, retry=attempt > 0)
            try:
                resp = await self._send(backend, ticket, request, gone)
            except HeadTimeout as exc:  # slow to begin, maybe not dead: the probes decide
                last_error = exc
                self.router.release(backend, ticket)
                self.metrics.retries.labels(backend.deployment, "head_timeout").inc()
                continue
            except UpstreamError as exc:
                last_error = exc
                self._failed(backend, ticket, str(exc), "before_first_byte")
                continue
            except BaseException:  # the client went, or this dispatch was cancelled
                self.router.release(backend, ticket)
                raise
            if resp.status in RETRYABLE_STATUS and attempt + 1 < self.config.max_attempts:
                resp.discard()
                self._failed(backend, ticket, f"answered {resp.status}", f"status_{resp.status}")
                continue
            ticket.started = True
            ticket.cut = resp.cut  # a hung replica's probe ends the relay (Router.eject)
            if request.stream:  # a stalled generation ends too (its /health may be fine)
                resp.watch_idle(self.config.stream_idle_s)
            return Exchange(self.router, entry, backend, ticket, resp)
        assert last_error is not None
        raise last_error

    def _failed(self, backend: Backend, ticket: Ticket, reason: str, retry_reason: str) -> None:
        """Eject the replica that failed the attempt, free its slot, count the retry."""
        if self.router.eject(backend, reason):
            self.metrics.ejected(backend.deployment, backend.replica_id)
        self.router.release(backend, ticket)
        self.metrics.retries.labels(backend.deployment, retry_reason).inc()

    async def _acquire(
        self,
        entry: DeploymentEntry,
        ticket: Ticket,
        gone: asyncio.Future[Any],
        deadline: float,
        *,
        retry: bool,
    ) -> tuple[DeploymentEntry, Backend]:
        """A slot at once if one is free, else wait in the queue (until ``deadline``) unless
        the client goes; a lane's request moves to the deployment it serves if the lane
        closes (``DeploymentGoneError``), a shadow's copy never does. The entry and slot."""
        try:
            return entry, await self._acquire_in(entry, ticket, gone, deadline, retry=retry)
        except DeploymentGoneError:
            served = (
                self.router.resolve(entry.serves) if entry.serves and not entry.mirror else None
            )
            if served is None:
                raise
        return served, await self._acquire_in(served, ticket, gone, deadline, retry=retry)

    async def _acquire_in(
        self,
        entry: DeploymentEntry,
        ticket: Ticket,
        gone: asyncio.Future[Any],
        deadline: float,
        *,
        retry: bool,
    ) -> Backend:
        router = self.router
        backend = router.try_acquire(entry, ticket)
        if backend is not None:
            return backend
        waited = router.clock()
        dm = self.metrics.of(entry.name)
        dm.queue_depth.set(len(entry.queue) + 1)
        task = asyncio.ensure_future(
            router.acquire(entry, ticket, retry=retry, wait_s=deadline - waited)
        )
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # this dispatch was cancelled: leave the queue, and
            # give back a slot got meanwhile (the waiting task would take one for nobody)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if not task.cancelled() and task.exception() is None:
                router.release(task.result(), ticket)
            raise
        finally:
            dm.queue_depth.set(len(entry.queue))
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientGoneError
        dm.queue_wait.observe(router.clock() - waited)
        return task.result()

    async def _send(
        self, backend: Backend, ticket: Ticket, request: Forward, gone: asyncio.Future[Any]
    ) -> Response:
        """Send the request to ``backend``; return once its head came. ``ticket.cancel``
        (ejection, replica gone) aborts it by closing the connection: UpstreamError. The
        client going away (``gone``) aborts it the same way: ClientGoneError."""
        timeout = self.config.first_byte_timeout_s if request.stream else None

        def abortable(abort: Abort) -> None:
            ticket.cancel = abort

        def client_left(_: object) -> None:
            ticket.abort("the client went away")

        if gone.done():
            raise ClientGoneError
        gone.add_done_callback(client_left)  # a callback, not a task racing the request
        try:
            return await backend.pool.request(
                "POST",
                request.path,
                request.headers,
                request.body,
                head_timeout=timeout,
                on_abortable=abortable,
            )
        except UpstreamError:
            if gone.done():
                raise ClientGoneError from None
            raise
        finally:
            gone.remove_done_callback(client_left)
            ticket.cancel = None
