"""Durable consumer of observed state and facts from every cluster.

Each valid message is handed to an ``ObservedStateSink`` and acked only after the sink
returned, so nothing is lost while the control plane restarts or the sink fails (the
message is redelivered). Malformed, wrong-version or misaddressed messages are
terminated (never redelivered), counted and logged; they never stop the consumer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client import Counter, Gauge, Histogram

from controlplane.contracts import (
    REPORTS_STREAM,
    SUBJECT_PREFIX,
    Fact,
    ObservedState,
    RejectedMessageError,
    cluster_from_subject,
    decode_report,
    utcnow,
)

log = logging.getLogger(__name__)

DURABLE_NAME = "gpufleet-controlplane"
SUPERSEDED_AFTER_S = 1.0
"""A heartbeat stored at least this long before it is handled waited behind a backlog: only
then is the server asked whether a newer one of the same plane is in the stream."""
ASK_AGAIN_AFTER_S = 60.0
"""After the server could not name a plane's newest heartbeat, how long queued heartbeats
are all recorded before it is asked again."""
MAX_TRACKED_SUBJECTS = 65_536
"""Planes whose newest heartbeat sequence the consumer keeps (then it starts afresh)."""

REJECTED = Counter(
    "gpufleet_bus_rejected_messages_total",
    "Messages from workload planes the control plane rejected, by reason",
    ["reason"],
)
RECEIVED = Counter(
    "gpufleet_bus_received_messages_total",
    "Messages from workload planes the control plane accepted, by type",
    ["type"],
)
SINK_FAILURES = Counter(
    "gpufleet_bus_sink_failures_total",
    "Accepted messages the sink failed to record (they are redelivered)",
)
REDELIVERED = Counter(
    "gpufleet_bus_redelivered_messages_total",
    "Messages that arrived again (an earlier delivery was not acked in time, or was nak'd)",
)
REPORT_DELAY = Histogram(
    "gpufleet_bus_report_delay_seconds",
    "From a report's time (the plane's clock) to the control plane receiving it, by type",
    ["type"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
PENDING = Gauge(
    "gpufleet_bus_pending_messages",
    "Reports in the stream not yet processed by the control plane (undelivered or unacked)",
)
SUPERSEDED = Counter(
    "gpufleet_bus_superseded_heartbeats_total",
    "Heartbeats acked unread: a newer heartbeat of the same plane was already in the stream",
)
STREAM_LAG = Gauge(
    "gpufleet_bus_stream_lag_messages",
    "The reports stream's last sequence minus the consumer's ack floor",
)


@dataclass(frozen=True)
class StreamProgress:
    """The reports stream's last sequence, the consumer's ack floor (every message up to it
    acked or terminated) and how many messages wait (undelivered or unacked)."""

    stream_last_seq: int
    ack_floor: int
    pending: int


class ObservedStateSink(Protocol):
    """Where accepted reports go. Both methods may be called again with the same message
    (redelivery after a crash before the ack): they must be idempotent on ``message.id``.
    Raising makes the consumer redeliver the message later. They may return the reasons of
    parts of the report they rejected (counted in `gpufleet_bus_rejected_messages_total`);
    the rest of the message counts and it is acked."""

    async def record_observed(
        self, cluster: str, state: ObservedState, received_at: datetime
    ) -> Sequence[str] | None: ...

    async def record_fact(
        self, cluster: str, fact: Fact, received_at: datetime
    ) -> Sequence[str] | None: ...

    # optional: ``transient(exc) -> bool``, True when ``exc`` says the sink's store is away
    # (retried for as long as it is); any other failure is retried ``max_sink_tries`` times


@dataclass
class InMemorySink:
    """An ObservedStateSink keeping everything in lists (tests, development)."""

    observed: list[tuple[str, ObservedState]] = field(default_factory=list)
    facts: list[tuple[str, Fact]] = field(default_factory=list)
    last_heartbeat: dict[str, datetime] = field(default_factory=dict)
    seen_ids: set[str] = field(default_factory=set)

    async def record_observed(
        self, cluster: str, state: ObservedState, received_at: datetime
    ) -> None:
        self.last_heartbeat[cluster] = received_at
        if str(state.id) not in self.seen_ids:
            self.seen_ids.add(str(state.id))
            self.observed.append((cluster, state))

    async def record_fact(self, cluster: str, fact: Fact, received_at: datetime) -> None:
        if str(fact.id) not in self.seen_ids:
            self.seen_ids.add(str(fact.id))
            self.facts.append((cluster, fact))


def _stream_seq(msg: Msg) -> int | None:
    try:
        return msg.metadata.sequence.stream
    except Exception:  # not a JetStream message
        return None


def _deliveries(msg: Msg) -> int:
    """How many times the server delivered this message (1 the first time)."""
    try:
        return msg.metadata.num_delivered or 1
    except Exception:  # not a JetStream message (a test publishing core NATS)
        return 1


def _stored_at(msg: Msg) -> datetime | None:
    """When the stream stored this message (its ack subject's time), if it says."""
    try:
        return msg.metadata.timestamp
    except Exception:  # not a JetStream message
        return None


def _reject(subject: str, reason: str, detail: str) -> None:
    REJECTED.labels(reason=reason).inc()
    log.warning("rejected message on %s (%s): %s", subject, reason, detail)


class ReportConsumer:
    """Binds (creating it if needed) the durable consumer and feeds the sink.

    Several control-plane processes may run one each: they share the durable through a
    deliver group, so each message goes to one of them.
    """

    def __init__(
        self,
        js: JetStreamContext,
        sink: ObservedStateSink,
        *,
        durable: str = DURABLE_NAME,
        clock: Callable[[], datetime] = utcnow,
        max_ack_pending: int = 1024,
        ack_wait_s: float = 30.0,
        redeliver_delay_s: float = 1.0,
        max_sink_tries: int = 20,
        superseded_after_s: float = SUPERSEDED_AFTER_S,
    ) -> None:
        self._js = js
        self._sink = sink
        self._durable = durable
        self._clock = clock
        self._max_ack_pending = max_ack_pending
        self._ack_wait_s = ack_wait_s
        self._redeliver_delay_s = redeliver_delay_s
        self._max_sink_tries = max_sink_tries
        self._superseded_after_s = superseded_after_s
        self._sub: JetStreamContext.PushSubscription | None = None
        self._newest: dict[str, tuple[int, datetime]] = {}  # subject → newest (seq, stored)
        self._ask_after = 0.0  # monotonic: when the server may be asked again after a failure

    async def start(self) -> None:
        self._newest.clear()  # the stream may have been made again: its sequences restart
        config = ConsumerConfig(
            durable_name=self._durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=self._max_ack_pending,
            ack_wait=self._ack_wait_s,
        )
        self._sub = await self._js.subscribe(
            f"{SUBJECT_PREFIX}.cluster.>",
            queue=self._durable,
            stream=REPORTS_STREAM,
            cb=self.handle,
            manual_ack=True,
            config=config,
        )

    async def stop(self) -> None:
        """Stop receiving; the durable consumer stays on the server and keeps our place."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
            # Make the server see the lost interest now; anything it already pushed to us
            # is redelivered to the next subscriber after ack_wait.
            await self._js._nc.flush()

    async def _superseded(self, msg: Msg, cluster: str) -> bool:
        """A heartbeat with a newer one of the same plane already in the stream: the newer one
        says all this one does (a heartbeat is the plane's whole state), so this one can be
        acked unread. Behind a backlog (a control plane back after an outage, or slower than
        its planes for a while) each plane's queued heartbeats then cost one database write,
        not one each, and the bus catches up with every plane at once.

        The server is asked only while more reports wait and this heartbeat waited
        (``superseded_after_s``). The newest heartbeat it names is kept (sequence and time
        stored): one older than it in both needs no question. Both, because a stream made
        again (NATS back on an empty store) numbers from 1 again."""
        seq, stored = _stream_seq(msg), _stored_at(msg)
        # the subject as a string: an invalid cluster token is rejected below, not here
        if seq is None or stored is None or msg.subject != f"{SUBJECT_PREFIX}.cluster.{cluster}.observed":  # fmt: skip
            return False
        known = self._newest.get(msg.subject)
        if known is not None and seq < known[0] and stored <= known[1]:
            return True
        try:
            waiting = (msg.metadata.num_pending or 0) > 0
        except Exception:
            waiting = False
        if not waiting and not (self._sub is not None and self._sub.pending_msgs > 0):
            return False
        # with many planes more reports nearly always wait: only a heartbeat that waited
        # (a backlog) is worth the question, not every one
        if (self._clock() - stored).total_seconds() < self._superseded_after_s:
            return False
        if time.monotonic() < self._ask_after:
            return False
        try:
            last = await self._js.get_last_msg(REPORTS_STREAM, msg.subject)
        except Exception as exc:  # the server cannot say: record this one, as without a backlog
            # and ask no more for a while (a permission it lacks costs a timeout each time)
            self._ask_after = time.monotonic() + ASK_AGAIN_AFTER_S
            log.warning("cannot read the newest heartbeat on %s (%s): each queued heartbeat "
                        "is recorded for %.0f s", msg.subject, exc, ASK_AGAIN_AFTER_S)  # fmt: skip
            return False
        if last.seq is None or last.time is None or last.seq <= seq:
            return False
        if len(self._newest) >= MAX_TRACKED_SUBJECTS:
            self._newest.clear()
        self._newest[msg.subject] = (last.seq, last.time)
        return True

    async def progress(self) -> StreamProgress:
        """How far the durable consumer has processed the reports stream (two JetStream
        API calls; they answer whether or not this process is subscribed)."""
        stream = await self._js.stream_info(REPORTS_STREAM)
        info = await self._js.consumer_info(REPORTS_STREAM, self._durable)
        last = stream.state.last_seq or 0
        pending = (info.num_pending or 0) + (info.num_ack_pending or 0)
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        progress = StreamProgress(last, last if pending == 0 else (floor or 0), pending)
        PENDING.set(progress.pending)
        STREAM_LAG.set(progress.stream_last_seq - progress.ack_floor)
        return progress

    async def handle(self, msg: Msg) -> None:
        """Validate one message, record it, ack it. Never raises."""
        try:
            await self._handle(msg)
        except Exception:  # a bug here must not kill the subscription
            log.exception("unexpected error handling %s; will be redelivered", msg.subject)

    async def _handle(self, msg: Msg) -> None:
        cluster = cluster_from_subject(msg.subject)
        if cluster is not None and await self._superseded(msg, cluster):
            SUPERSEDED.inc()
            await msg.ack()
            return
        try:
            if cluster is None:
                raise RejectedMessageError("subject", f"unexpected subject {msg.subject}")
            report = decode_report(msg.data)
            if report.cluster != cluster or report.source != f"cluster/{cluster}":
                raise RejectedMessageError(
                    "cluster_mismatch",
                    f"message says cluster={report.cluster} source={report.source} "
                    f"but arrived on {msg.subject}",
                )
        except RejectedMessageError as exc:
            _reject(msg.subject, exc.reason, exc.detail)
            await msg.term()
            return
        received_at = self._clock()
        if _deliveries(msg) > 1:
            REDELIVERED.inc()
            # a retry's clock says nothing of the report's age: a heartbeat redelivered
            # after a newer one was recorded must read as older than it (the sink keeps
            # the newer), so it is dated when the stream stored it
            received_at = min(received_at, _stored_at(msg) or received_at)
        else:  # a redelivery's delay says how late the retry was, not how slow the bus is
            delay = (received_at - report.time).total_seconds()
            REPORT_DELAY.labels(type=report.type).observe(max(delay, 0.0))
        try:
            if isinstance(report, ObservedState):
                rejected = await self._sink.record_observed(cluster, report, received_at)
            else:
                rejected = await self._sink.record_fact(cluster, report, received_at)
        except RejectedMessageError as exc:  # the sink found it bad: never worth a retry
            _reject(msg.subject, exc.reason, exc.detail)
            await msg.term()
            return
        except Exception as exc:
            SINK_FAILURES.inc()
            transient = getattr(self._sink, "transient", None)
            if _deliveries(msg) >= self._max_sink_tries and not (transient and transient(exc)):
                # a message the sink fails on every time (not for want of its database)
                # would be redelivered for ever and hold the stream's ack floor — and with
                # it every plane's liveness: dropped, counted, logged
                _reject(msg.subject, "sink_failed", f"{report.type} {report.id}: "
                        f"{type(exc).__name__} on {_deliveries(msg)} tries; dropped")  # fmt: skip
                await msg.term()
                return
            log.exception("sink failed on %s %s; redelivering", report.type, report.id)
            await msg.nak(delay=self._redeliver_delay_s)
            return
        for reason in rejected or ():
            REJECTED.labels(reason=reason).inc()
        RECEIVED.labels(type=report.type).inc()
        await msg.ack()
