"""The control plane's NATS process (`gpufleet bus`): its composition root.

Consumes every cluster's heartbeats and facts through the durable consumer into PostgreSQL,
and publishes each cluster's desired-state snapshot whenever its desired generation moves
(all of them once at start: PostgreSQL is the source of truth, the KV bucket a copy).
A cluster nothing was ever placed on (desired generation 0) has no snapshot yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from datetime import datetime

import nats
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import ensure_bus
from controlplane.bus.consumer import DURABLE_NAME, ReportConsumer, StreamProgress
from controlplane.bus.desired import DesiredPublisher
from controlplane.contracts import DesiredState, utcnow
from controlplane.db.models import Cluster
from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.liveness import CatchUp
from controlplane.services.clusters import record_bus_progress
from controlplane.services.desired import desired_state
from controlplane.services.observed import DbSink
from controlplane.settings import Settings, get_settings
from controlplane.trust import Bounds

log = logging.getLogger("gpufleet.bus")


def pending_snapshots(
    factory: sessionmaker[Session], published: dict[str, int]
) -> list[DesiredState]:
    with factory() as session:
        clusters = session.scalars(select(Cluster).order_by(Cluster.name)).all()
        return [
            desired_state(session, c)
            for c in clusters
            if c.desired_generation >= 1 and published.get(c.name, 0) < c.desired_generation
        ]


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
) -> None:
    """Every `every_s`: sample the consumer's progress and record it. A failure (NATS or
    PostgreSQL away) skips one sample: the horizon then stays put, which is the truth."""
    catch_up = CatchUp()
    while not stop.is_set():
        try:
            now = clock()  # before asking: the sample claims no more than the stream held
            progress = await consumer.progress()
            await asyncio.to_thread(record_progress, factory, name, catch_up, progress, now)
        except Exception as exc:  # logged; retried on the next tick
            log.warning("could not record the bus's progress: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def trigger_replan(reason: str) -> None:
    from controlplane.tasks import request_replan

    request_replan(reason)


async def run_bus(settings: Settings, stop: asyncio.Event, poll_s: float = 0.25) -> None:
    user = os.environ.get("GPUFLEET_NATS_USER")
    password = os.environ.get("GPUFLEET_NATS_PASSWORD")
    auth = {"user": user, "password": password} if user and password else {}
    nc = await nats.connect(settings.nats_url, max_reconnect_attempts=-1, **auth)  # type: ignore[arg-type]
    js = nc.jetstream()
    kv = await ensure_bus(js)
    factory = make_session_factory(make_engine(settings.database_url, pool_size=4))
    loop = asyncio.get_running_loop()

    def on_change(reason: str) -> None:  # the broker call blocks: keep it off the loop
        loop.run_in_executor(None, trigger_replan, reason)

    bounds = Bounds(
        demand_factor=settings.report_demand_factor,
        demand_max=settings.report_demand_max,
        in_flight_max=settings.report_in_flight_max,
        queue_depth_max=settings.report_queue_depth_max,
    )
    sink = DbSink(factory, on_change=on_change, bounds=bounds)
    consumer = ReportConsumer(js, sink)
    await consumer.start()
    progress = asyncio.create_task(
        keep_progress(consumer, factory, settings.bus_progress_every_s, stop)
    )
    published: dict[str, int] = {}
    publisher = DesiredPublisher(kv)
    try:
        while not stop.is_set():
            for state in await asyncio.to_thread(pending_snapshots, factory, published):
                result = await publisher.publish(state)
                published[state.cluster] = state.generation
                log.info(
                    "desired state of %s at generation %d: %s",
                    state.cluster,
                    state.generation,
                    result.outcome,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
    finally:
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress
        await consumer.stop()
        await nc.drain()


def main() -> int:
    logging.basicConfig(level=os.environ.get("GPUFLEET_LOG_LEVEL", "INFO"))

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_bus(get_settings(), stop)

    asyncio.run(_main())
    return 0
