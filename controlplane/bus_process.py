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

import nats
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import ensure_bus
from controlplane.bus.consumer import ReportConsumer
from controlplane.bus.desired import DesiredPublisher
from controlplane.contracts import DesiredState
from controlplane.db.models import Cluster
from controlplane.db.session import make_engine, make_session_factory
from controlplane.services.desired import desired_state
from controlplane.services.observed import DbSink
from controlplane.settings import Settings, get_settings

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

    sink = DbSink(factory, on_change=on_change)
    consumer = ReportConsumer(js, sink)
    await consumer.start()
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
