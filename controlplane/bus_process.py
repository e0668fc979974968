"""The control plane's NATS process (`gpufleet bus`): its composition root.

Consumes every cluster's heartbeats and facts through the durable consumer into PostgreSQL,
and publishes each cluster's desired-state snapshot whenever its desired generation moves
(all of them once at start: PostgreSQL is the source of truth, the KV bucket a copy).
A cluster nothing was ever placed on (desired generation 0) has no snapshot yet. A KV
entry ahead of the cluster's numbering (a generation the control plane never issued) makes
it start a new epoch and republish (`controlplane.services.epochs`). With
`GPUFLEET_BUS_METRICS_PORT` set it serves its Prometheus metrics (rejected reports among
them) on that port's `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from wsgiref.simple_server import WSGIServer

import nats
from prometheus_client import start_http_server
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import ensure_bus
from controlplane.bus.consumer import ReportConsumer
from controlplane.bus.desired import DesiredPublisher, PublishResult
from controlplane.contracts import DesiredState
from controlplane.db.models import Cluster
from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.services import epochs
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


def trigger_replan(reason: str) -> None:
    from controlplane.tasks import request_replan

    request_replan(reason)


async def run_bus(settings: Settings, stop: asyncio.Event, poll_s: float = 0.25) -> None:
    user = os.environ.get("GPUFLEET_NATS_USER")
    password = os.environ.get("GPUFLEET_NATS_PASSWORD")
    auth = {"user": user, "password": password} if user and password else {}
    metrics = serve_metrics(settings.bus_metrics_port)
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
                    "desired state of %s at generation %d (epoch %d): %s",
                    state.cluster,
                    state.generation,
                    state.epoch,
                    result.outcome,
                )
                # a new epoch bumps the generation: the next pass publishes it
                try:
                    await asyncio.to_thread(claim_if_ahead, factory, state, result)
                except Exception:  # the database may be away: the next pass tries again
                    log.exception("checking the desired-state entry of %s failed", state.cluster)
                    published.pop(state.cluster, None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
    finally:
        await consumer.stop()
        await nc.drain()
        if metrics is not None:
            metrics.shutdown()
            metrics.server_close()


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
