"""The control plane's NATS process (`gpufleet bus`): its composition root.

Consumes every cluster's heartbeats and facts through the durable consumer into PostgreSQL,
and publishes each cluster's desired-state snapshot whenever its desired generation moves
(all of them once at start: PostgreSQL is the source of truth, the KV bucket a copy).
A cluster nothing was ever placed on (desired generation 0) has no snapshot yet. A snapshot
too large for the server's max_payload is not sent (an event says so, once per episode) and
never stops the others; a deleted cluster's key gets an empty snapshot so its agent stops.
A KV entry ahead of the cluster's numbering (a generation the control plane never issued)
makes it start a new epoch and republish (`controlplane.services.epochs`). The gateways'
routing table is rebuilt whenever what it is built from may have moved (`RoutesLoop`) and
published at a new generation only when its content changed. With
`GPUFLEET_BUS_METRICS_PORT` set it serves its Prometheus metrics (rejected reports among
them) on that port's `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from wsgiref.simple_server import WSGIServer

import nats
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from prometheus_client import start_http_server
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import ensure_bus
from controlplane.bus.consumer import DURABLE_NAME, ReportConsumer, StreamProgress
from controlplane.bus.desired import (
    DesiredPublisher,
    DesiredStateTooLarge,
    PublishResult,
    retire_desired,
    stored_clusters,
)
from controlplane.bus.routes import RoutesPublisher, RoutesResult, RoutesTooLarge
from controlplane.bus.streams import ensure_routes_bucket
from controlplane.contracts import DesiredState, RoutingTable, encode, utcnow
from controlplane.db.models import Cluster
from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.liveness import CatchUp
from controlplane.replans import ReplanRequests
from controlplane.routes import RouteBook
from controlplane.services import epochs, publication
from controlplane.services import routes as routes_service
from controlplane.services.clusters import record_bus_progress
from controlplane.services.desired import desired_state
from controlplane.services.observed import DbSink
from controlplane.settings import Settings, db_timeouts, get_settings
from controlplane.trust import Bounds
from gpufleet_logging import configure_logging

log = logging.getLogger("gpufleet.bus")


Published = dict[str, tuple[str, int]]
"""Cluster name → (the cluster's id, the generation published for it): a cluster deleted
and made again under its name (a new id) is published afresh."""


def _pending(
    factory: sessionmaker[Session], published: Published
) -> tuple[list[tuple[str, DesiredState]], set[str]]:
    """The snapshots to publish (with their cluster's id), and every cluster's name."""
    with factory() as session:
        clusters = session.scalars(select(Cluster).order_by(Cluster.name)).all()
        return [(c.id, desired_state(session, c)) for c in clusters if _due(c, published)], {
            c.name for c in clusters
        }


def _due(cluster: Cluster, published: Published) -> bool:
    if cluster.desired_generation < 1:
        return False
    seen = published.get(cluster.name)
    return seen is None or seen[0] != cluster.id or seen[1] < cluster.desired_generation


def _write(factory: sessionmaker[Session], write: Callable[[Session], None]) -> None:
    with factory() as session, session.begin():
        write(session)


class SnapshotLoop:
    """The publisher's side of the bus process: each `tick()` publishes every cluster whose
    desired generation moved, retires the keys of deleted clusters, and survives a snapshot
    it cannot send (that cluster only waits for its next generation)."""

    def __init__(
        self, factory: sessionmaker[Session], kv: KeyValue, max_payload: int | None
    ) -> None:
        self._factory, self._kv = factory, kv
        self._publisher = DesiredPublisher(kv, max_payload)
        self._published: Published = {}
        self._known: set[str] | None = None  # clusters with a key: the bucket's, at start
        self._too_large: set[str] = set()
        self._failing: dict[str, str] = {}

    def forget(self) -> None:
        """The bucket was made again (the NATS server lost its store): publish every
        cluster's desired state afresh at the next tick."""
        self._published.clear()
        self._known = None
        self._failing.clear()
        self._publisher.forget()

    async def tick(self) -> None:
        """Never raises: what fails is logged and tried again (a cluster's publication at
        the next tick; a key it cannot retire — unreadable, or not a cluster name — is left
        as it is). One bad key in the bucket used to stop the bus process at every start:
        no desired state published, no report consumed."""
        try:
            if self._known is None:
                self._known = await stored_clusters(self._kv)
            states, names = await asyncio.to_thread(_pending, self._factory, self._published)
        except Exception:
            log.exception("reading what to publish failed; retrying at the next tick")
            return
        for gone in sorted(self._known - names):
            try:
                await self._retire(gone)
            except Exception:
                log.exception("retiring the desired state of %r failed; key left as it is", gone)
        self._known = (self._known & names) | {s.cluster for _, s in states}
        for cluster_id, state in states:
            try:
                await self._publish(cluster_id, state)
            except Exception as exc:
                if self._failing.get(state.cluster) != repr(exc):  # once while it fails so
                    log.exception("publishing %s's desired state failed; retrying", state.cluster)
                self._failing[state.cluster] = repr(exc)
            else:
                self._failing.pop(state.cluster, None)

    async def _retire(self, cluster: str) -> None:
        result = await retire_desired(self._kv, cluster)
        self._published.pop(cluster, None)
        self._too_large.discard(cluster)
        if result is not None:
            log.info(
                "cluster %s was deleted: empty desired state at generation %d (%s)",
                cluster,
                result.stored_generation,
                result.outcome,
            )

    async def _publish(self, cluster_id: str, state: DesiredState) -> None:
        try:
            result = await self._publisher.publish(state)
        except DesiredStateTooLarge as exc:
            self._published[state.cluster] = (cluster_id, state.generation)  # at its next one
            log.error("%s: not sent; other clusters are unaffected", exc)
            if state.cluster not in self._too_large:
                self._too_large.add(state.cluster)
                size, limit, biggest = exc.size, exc.limit, exc.biggest()
                await asyncio.to_thread(
                    _write,
                    self._factory,
                    lambda s: publication.record_too_large(
                        s, state.cluster, state.generation, size, limit, biggest
                    ),
                )
            return
        self._published[state.cluster] = (cluster_id, state.generation)
        log.info(
            "desired state of %s at generation %d (epoch %d): %s",
            state.cluster,
            state.generation,
            state.epoch,
            result.outcome,
        )
        # a KV entry ahead of what we issued: a new epoch bumps the generation, the next tick
        # publishes it
        try:
            if await asyncio.to_thread(claim_if_ahead, self._factory, state, result):
                return
        except Exception:  # the database may be away: the next tick tries again
            log.exception("checking the desired-state entry of %s failed", state.cluster)
            self._published.pop(state.cluster, None)
            return
        if state.cluster in self._too_large:
            self._too_large.discard(state.cluster)
            size = len(encode(state))
            await asyncio.to_thread(
                _write,
                self._factory,
                lambda s: publication.record_sent_again(s, state.cluster, state.generation, size),
            )


class RoutesLoop:
    """The routing table's side of the bus process: each `tick()` checks a cheap fingerprint
    of what the table is built from and, when it moved (or every ``full_every_s``), builds
    the table, numbers it (a new generation only if its content changed) and publishes it
    when its version is not yet in the bucket; every ``full_every_s`` it re-asserts it (a
    bucket entry overwritten by anyone else is then found, `claim_stored`). A failure
    (PostgreSQL or NATS away) is logged and retried on the next tick."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        kv: KeyValue,
        max_payload: int | None,
        full_every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory, self._clock, self._full_every_s = factory, clock, full_every_s
        self._publisher = RoutesPublisher(kv, max_payload)
        self._fingerprint: tuple[object, ...] | None = None
        self._built_at: float | None = None
        self._published: tuple[int, int] | None = None
        self._left_out: tuple[object, ...] = ()

    def forget(self) -> None:
        """The bucket was made again: build and publish the table at the next tick."""
        self._fingerprint = self._built_at = self._published = None
        self._publisher.forget()

    async def tick(self) -> None:
        try:
            await self._tick()
        except Exception:  # the next tick rebuilds from scratch
            log.exception("publishing the routing table failed; retrying")
            self._fingerprint = None

    async def _tick(self) -> None:
        now = self._clock()
        fingerprint = await asyncio.to_thread(self._read_fingerprint)
        due = self._built_at is None or now - self._built_at >= self._full_every_s
        if fingerprint == self._fingerprint and not due:
            return
        if due:  # re-assert the table: a bucket overwritten meanwhile is found and corrected
            self._published = None
        numbered = await asyncio.to_thread(self._number)
        self._fingerprint, self._built_at = fingerprint, now
        self._report_left_out(numbered.book)
        table = numbered.table
        if self._published == table.version:
            return
        try:
            result = await self._publisher.publish(table)
        except RoutesTooLarge as exc:
            log.error("%s", exc)
            self._published = table.version  # retried when its content changes
            return
        if result.outcome == "published":
            self._published = table.version
            log.info(
                "routing table at generation %d (epoch %d): %d deployment(s), %d plane route(s)",
                table.generation,
                table.epoch,
                len(table.deployments),
                sum(len(d.planes) for d in table.deployments),
            )
            return
        await self._stale(table, result)

    async def _stale(self, table: RoutingTable, result: RoutesResult) -> None:
        stored = result.stored
        if stored is not None and await asyncio.to_thread(
            _write_returning, self._factory, lambda s: routes_service.claim_stored(s, stored)
        ):
            self._fingerprint = None  # a new epoch: number and publish on the next tick
            return
        self._published = table.version

    def _read_fingerprint(self) -> tuple[object, ...]:
        with self._factory() as session:
            return routes_service.fingerprint(session)

    def _number(self) -> routes_service.Numbered:
        with transaction(self._factory) as session:
            return routes_service.number_table(session, utcnow())

    def _report_left_out(self, book: RouteBook) -> None:
        left_out = (book.unreachable, book.outside)
        if left_out == self._left_out:
            return
        self._left_out = left_out
        for deployment, cluster in book.unreachable:
            log.warning(
                "cluster %s carries replicas of %s but has no endpoint: the gateways cannot "
                "reach it (set the cluster's endpoint to its router's URL)",
                cluster,
                deployment,
            )
        for deployment, cluster in book.outside:
            log.error(
                "cluster %s carries replicas of %s outside its residency: left out of the "
                "routing table",
                cluster,
                deployment,
            )


def _write_returning(factory: sessionmaker[Session], write: Callable[[Session], bool]) -> bool:
    with transaction(factory) as session:
        return write(session)


def claim_if_ahead(
    factory: sessionmaker[Session], state: DesiredState, result: PublishResult
) -> bool:
    """The KV entry refused ``state`` holding a newer version: a new epoch (True) if the
    control plane never issued that version; False if it did (another process is ahead)."""
    if not result.ahead(state):
        return False
    with transaction(factory) as session:
        return epochs.claim_stored(
            session, state.cluster, result.stored_epoch, result.stored_generation
        )


def serve_metrics(port: int | None, host: str = "127.0.0.1") -> WSGIServer | None:
    """Serve this process's Prometheus metrics on ``host:port``/metrics (in a thread) until
    the returned server is shut down; None without a port."""
    if port is None:
        return None
    server, _ = start_http_server(port, addr=host)
    log.info("bus metrics on http://%s:%d/metrics", host, port)
    return server


def record_progress(
    factory: sessionmaker[Session],
    consumer: str,
    catch_up: CatchUp,
    progress: StreamProgress,
    now: datetime,
) -> None:
    """One sample of the consumer's progress into `bus_progress` (see `liveness.CatchUp`)."""
    caught_up = catch_up.observe(now, progress.stream_last_seq, progress.ack_floor)
    with transaction(factory) as session:
        record_bus_progress(
            session,
            consumer,
            alive_at=now,
            caught_up_at=caught_up,
            stream_last_seq=progress.stream_last_seq,
            ack_floor=progress.ack_floor,
            pending=progress.pending,
        )


async def keep_progress(
    consumer: ReportConsumer,
    factory: sessionmaker[Session],
    every_s: float,
    stop: asyncio.Event,
    name: str = DURABLE_NAME,
    clock: Callable[[], datetime] = utcnow,
    lost: asyncio.Event | None = None,
) -> None:
    """Every `every_s`: sample the consumer's progress and record it. A failure (NATS or
    PostgreSQL away) skips one sample: the horizon then stays put, which is the truth. The
    stream or the consumer not found on the server sets ``lost`` (`run_bus` makes them
    again)."""
    catch_up = CatchUp()
    while not stop.is_set():
        try:
            now = clock()  # before asking: the sample claims no more than the stream held
            progress = await consumer.progress()
            await asyncio.to_thread(record_progress, factory, name, catch_up, progress, now)
        except NotFoundError as exc:  # the stream or our consumer is gone
            log.warning("the reports stream or its consumer is missing on NATS: %s", exc)
            if lost is not None:
                lost.set()
        except Exception as exc:  # logged; retried on the next tick
            log.warning("could not record the bus's progress: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def trigger_replan(reason: str) -> None:
    from controlplane.tasks import request_replan

    request_replan(reason)


DRAIN_TIMEOUT_S = 5
"""At a stop, how long the reports already received may take to be recorded; those left are
redelivered (to the next bus process) after the consumer's ack wait."""


async def run_bus(settings: Settings, stop: asyncio.Event, poll_s: float = 0.25) -> None:
    user = os.environ.get("GPUFLEET_NATS_USER")
    password = os.environ.get("GPUFLEET_NATS_PASSWORD")
    auth = {"user": user, "password": password} if user and password else {}
    metrics = serve_metrics(settings.bus_metrics_port)
    nc = await nats.connect(  # type: ignore[arg-type]
        settings.nats_url, max_reconnect_attempts=-1, drain_timeout=DRAIN_TIMEOUT_S, **auth
    )
    js = nc.jetstream()
    kv = await ensure_bus(js)
    routes_kv = await ensure_routes_bucket(js)
    factory = make_session_factory(
        make_engine(settings.database_url, pool_size=4, **db_timeouts(settings))
    )

    # the broker call blocks: off the loop, and a burst of reports asks for one re-plan
    on_change = ReplanRequests(trigger_replan).request

    bounds = Bounds(
        demand_factor=settings.report_demand_factor,
        demand_max=settings.report_demand_max,
        in_flight_max=settings.report_in_flight_max,
        queue_depth_max=settings.report_queue_depth_max,
        tokens_per_s_max=settings.report_tokens_per_s_max,
        bytes_per_s_max=settings.report_bytes_per_s_max,
        facts_per_s=settings.report_facts_per_s,
        facts_burst=settings.report_facts_burst,
        heartbeats_per_s=settings.report_heartbeats_per_s,
        heartbeats_burst=settings.report_heartbeats_burst,
    )
    sink = DbSink(factory, on_change=on_change, bounds=bounds)
    consumer = ReportConsumer(js, sink)
    await consumer.start()
    lost = asyncio.Event()
    progress = asyncio.create_task(
        keep_progress(consumer, factory, settings.bus_progress_every_s, stop, lost=lost)
    )
    snapshots = SnapshotLoop(factory, kv, nc.max_payload)  # the server's, from its INFO
    routes = RoutesLoop(factory, routes_kv, nc.max_payload)

    async def make_again() -> None:
        """The NATS server lost the bus's streams (restarted on an empty store, or they
        were deleted): make them again, bind the consumer again, publish everything."""
        lost.clear()
        try:
            await ensure_bus(js)
            await consumer.stop()
            await consumer.start()
        except Exception as exc:  # NATS still away: the next progress sample says again
            log.warning("could not make the bus's streams again yet: %s", exc)
            return
        snapshots.forget()
        routes.forget()
        log.warning(
            "the NATS server had lost the bus's streams (restarted on an empty store?): made "
            "them again; publishing every desired state and the routing table again"
        )

    try:
        while not stop.is_set():
            if lost.is_set():
                await make_again()
            await snapshots.tick()
            await routes.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
    finally:
        progress.cancel()
        # gather, not `suppress(CancelledError)`: a cancel of this task itself goes on up
        await asyncio.gather(progress, return_exceptions=True)
        await consumer.stop()
        await nc.drain()  # bounded by drain_timeout: what it leaves unacked is redelivered
        if metrics is not None:
            metrics.shutdown()
            metrics.server_close()


def main() -> int:
    configure_logging("bus")

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_bus(get_settings(), stop)

    asyncio.run(_main())
    return 0
