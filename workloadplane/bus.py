"""The agent's side of the NATS bus: watch its desired-state key, publish reports.

- The watch is an ephemeral push consumer on the KV stream filtered to the cluster's own
  key, delivering the last value first. It is re-created after every reconnect, and the key
  is also re-read every ``resync_interval`` — both are harmless because the agent applies
  only newer generations.
- Heartbeats are best effort (the next one supersedes a lost one). Facts are sent at once
  when nothing waits, else through an in-memory outbox, and are retried until JetStream
  acknowledges them; ``Nats-Msg-Id`` (the envelope id) makes retries idempotent.
- NATS being unreachable never raises out of here: the agent keeps serving.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import Counter

from controlplane.contracts import (
    DESIRED_STREAM,
    MAX_REPORT_BYTES,
    DesiredState,
    Envelope,
    NatsCredentials,
    RejectedMessageError,
    decode_desired,
    desired_subject,
    encode,
    fact_subject,
    observed_subject,
)
from workloadplane.natsconnect import connect_until_up, watch_key

log = logging.getLogger(__name__)

REJECTED = Counter(
    "gpufleet_agent_rejected_messages_total",
    "Desired-state messages the agent rejected, by reason",
    ["reason"],
)
PUBLISH_FAILURES = Counter(
    "gpufleet_agent_publish_failures_total",
    "Reports the agent failed to publish, by kind",
    ["kind"],
)

KV_OPERATION = "KV-Operation"
OUTBOX_LIMIT = 10_000
OUTBOX_BATCH = 64

DesiredHandler = Callable[[DesiredState, bytes], Awaitable[None]]
"""Called with each decoded snapshot and the bytes it was decoded from."""


class AgentBus:
    def __init__(
        self,
        cluster: str,
        servers: str | list[str],
        credentials: NatsCredentials | None,
        on_desired: DesiredHandler,
        *,
        resync_interval: float = 30.0,
        publish_timeout: float = 2.0,
        retry_delay: float = 0.5,
    ) -> None:
        self.cluster = cluster
        self._servers = servers
        self._credentials = credentials
        self._on_desired = on_desired
        self._resync_interval = resync_interval
        self._publish_timeout = publish_timeout
        self._retry_delay = retry_delay
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._watch: JetStreamContext.PushSubscription | None = None
        self._outbox: collections.deque[Envelope] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._connected = asyncio.Event()
        self._resync_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start connecting and serving in the background; returns at once."""
        self._tasks = [
            asyncio.create_task(self._connect_loop(), name="bus-connect"),
            asyncio.create_task(self._send_outbox(), name="bus-outbox"),
            asyncio.create_task(self._resync_loop(), name="bus-resync"),
        ]

    async def close(self) -> None:
        for task in [*self._tasks, *self._in_flight]:
            task.cancel()
        for task in [*self._tasks, *self._in_flight]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def outbox_size(self) -> int:
        return len(self._outbox)

    async def _connect_loop(self) -> None:
        self._nc = await connect_until_up(
            self._servers,
            f"gpufleet-agent-{self.cluster}",
            self._credentials,
            why_waiting="serving from the snapshot on disk; retrying",
            callbacks={
                "reconnected_cb": self._on_reconnected,
                "disconnected_cb": self._on_disconnected,
                "error_cb": self._on_error,
            },
        )
        self._js = self._nc.jetstream(timeout=self._publish_timeout)
        self._connected.set()
        await self._subscribe_watch()

    async def _on_reconnected(self) -> None:
        log.info("reconnected to NATS; re-creating the desired-state watch")
        self._connected.set()
        await self._subscribe_watch()
        self._outbox_ready.set()

    async def _on_disconnected(self) -> None:
        self._connected.clear()

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS error: %s", exc)

    # --- desired state ------------------------------------------------------------------

    async def _subscribe_watch(self) -> None:
        if self._nc is None or self._js is None:
            return
        old, self._watch = self._watch, None
        try:
            self._watch = await watch_key(
                self._js, old, desired_subject(self.cluster), DESIRED_STREAM, self._on_watch
            )
        except Exception as exc:  # bucket missing or server busy: the resync loop retries
            log.warning("cannot watch desired state yet (%s); will retry", exc)
            self._resync_now.set()

    async def _on_watch(self, msg: Msg) -> None:
        if msg.headers and msg.headers.get(KV_OPERATION) in ("DEL", "PURGE"):
            log.warning("desired state key deleted; keeping the last snapshot")
            return
        await self._deliver(msg.data, msg.subject)

    async def _deliver(self, data: bytes, origin: str) -> None:
        try:
            state = decode_desired(data)
        except RejectedMessageError as exc:
            REJECTED.labels(reason=exc.reason).inc()
            log.warning("rejected desired state from %s: %s", origin, exc)
            return
        if state.cluster != self.cluster:
            REJECTED.labels(reason="cluster_mismatch").inc()
            log.warning("rejected desired state for cluster %s", state.cluster)
            return
        try:
            await self._on_desired(state, data)
        except Exception:
            log.exception("applying desired state generation %s failed", state.generation)

    async def resync(self) -> None:
        """Read the key directly (last-by-subject) and hand it over; re-watch if needed."""
        if self._nc is None or not self._nc.is_connected:
            return
        if self._watch is None:
            await self._subscribe_watch()
        try:
            raw = await self._nc.jsm(timeout=self._publish_timeout).get_msg(
                DESIRED_STREAM, subject=desired_subject(self.cluster), direct=True
            )
        except NotFoundError:
            return
        except Exception as exc:
            log.debug("resync failed: %s", exc)
            return
        if raw.data and not (raw.headers and raw.headers.get(KV_OPERATION)):
            await self._deliver(raw.data, "resync")

    async def _resync_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resync_now.wait(), self._resync_interval)
            self._resync_now.clear()
            await self.resync()
            if self._watch is None:
                await asyncio.sleep(self._retry_delay)
                self._resync_now.set()

    # --- reports ------------------------------------------------------------------------

    async def _publish(self, subject: str, message: Envelope) -> None:
        if self._js is None or self._nc is None or not self._nc.is_connected:
            raise ConnectionError("not connected to NATS")
        await self._js.publish(
            subject,
            encode(message),
            headers={"Nats-Msg-Id": str(message.id)},
            timeout=self._publish_timeout,
        )

    async def publish_heartbeat(self, message: Envelope) -> bool:
        """Best effort; False if it could not be published (the next heartbeat supersedes)."""
        try:
            await self._publish(observed_subject(self.cluster), message)
        except MaxPayloadError:
            PUBLISH_FAILURES.labels(kind="heartbeat").inc()
            size = len(encode(message))
            limit = self._nc.max_payload if self._nc is not None else 0
            log.error(  # not transient: every heartbeat fails, and the plane is taken for dead
                "heartbeat of %d bytes is over the NATS server's max_payload (%d bytes): raise "
                "max_payload to at least %d (gpufleet's own server allows %d)",
                size,
                limit,
                size,
                MAX_REPORT_BYTES,
            )
            return False
        except Exception as exc:
            PUBLISH_FAILURES.labels(kind="heartbeat").inc()
            log.debug("heartbeat not published: %s", exc)
            return False
        return True

    def publish_fact(self, fact: Envelope) -> None:
        """Send a fact; it is retried until JetStream acknowledges it.

        With nothing waiting in the outbox (and fewer than ``OUTBOX_BATCH`` sends in flight)
        it is sent at once, in a task of its own (no hop through the outbox task: facts are
        on the desired → applied path); one that fails joins the outbox. Otherwise it queues
        behind what waits, in order. So facts keep
        their order except around a failed send, which is retried after later ones."""
        if not self._outbox and self.connected and len(self._in_flight) < OUTBOX_BATCH:
            task = asyncio.create_task(self._send_now(fact))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            return
        self._queue(fact)

    async def _send_now(self, fact: Envelope) -> None:
        try:
            await self._publish(fact_subject(self.cluster, fact.type), fact)
        except Exception as exc:
            PUBLISH_FAILURES.labels(kind="fact").inc()
            log.debug("fact %s not published yet: %s", fact.id, exc)
            self._queue(fact)

    def _queue(self, fact: Envelope) -> None:
        if len(self._outbox) >= OUTBOX_LIMIT:
            dropped = self._outbox.popleft()
            log.error("fact outbox full; dropping oldest %s %s", dropped.type, dropped.id)
        self._outbox.append(fact)
        self._outbox_ready.set()

    async def _send_outbox(self) -> None:
        """Publish what the outbox holds, a batch at a time, pipelined: every fact of a batch
        is sent before the first acknowledgement is awaited (a fact queued behind another
        does not wait a round trip). Acknowledged ones leave the outbox; the others stay, in
        order, and are sent again after ``retry_delay`` (``Nats-Msg-Id`` de-duplicates)."""
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                batch = list(itertools.islice(self._outbox, OUTBOX_BATCH))
                results = await asyncio.gather(
                    *(self._publish(fact_subject(self.cluster, f.type), f) for f in batch),
                    return_exceptions=True,
                )
                failed = []
                for fact, result in zip(batch, results, strict=True):
                    if self._outbox and self._outbox[0] is fact:  # (unless dropped when full)
                        self._outbox.popleft()
                    if isinstance(result, BaseException):
                        PUBLISH_FAILURES.labels(kind="fact").inc()
                        log.debug("fact %s not published yet: %s", fact.id, result)
                        failed.append(fact)
                if failed:
                    self._outbox.extendleft(reversed(failed))
                    await asyncio.sleep(self._retry_delay)
