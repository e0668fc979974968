"""Running the router: as the plane's own process, standalone on static backends, or inside
an agent's event loop (tests, development).

``serve_router`` is the router's composition root: metrics, dispatcher, prober and the HTTP
app are built here and handed to each other. ``gpufleet router --state-dir DIR --port 8080``
(``run_plane``) is the plane's data path in a process of its own: it follows the agent's
state directory (``follower.PlaneFollower``), so an agent crash costs nothing in flight.
``gpufleet router --port 8080 --replica chat=http://127.0.0.1:8001 ...`` (``run_static``)
serves fixed replicas (benchmarks, demos).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    NatsCredentials,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.router.app import RouterApp
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.dispatch import Dispatcher
from workloadplane.router.follower import PlaneFollower
from workloadplane.router.httpserver import HttpServer, Limits
from workloadplane.router.load import RecentWindow
from workloadplane.router.loadbus import LoadPublisher
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.prober import Prober


async def serve_router(
    router: Router,
    host: str,
    port: int,
    stop: asyncio.Event,
    also_metrics: Sequence[CollectorRegistry] = (),
    *,
    follower: PlaneFollower | None = None,
    recent: RecentWindow | None = None,
    publisher: LoadPublisher | None = None,
) -> None:
    """Serve ``router`` on ``host:port`` (and probe its replicas) until ``stop`` is set;
    ``/metrics`` serves ``also_metrics`` beside the router's own; with ``follower``, the
    router is fed from the plane's state directory meanwhile; with ``publisher`` (reading
    ``recent``, the window the app records into), the plane's load goes to the gateways."""
    config = router.config
    metrics = RouterMetrics(also_metrics, recent)
    prober = Prober(router, metrics)
    limits = Limits(
        max_body_bytes=config.max_body_bytes,
        max_headers=config.max_headers,
        max_header_bytes=config.max_header_bytes,
    )
    app = RouterApp(router, Dispatcher(router, metrics), metrics)
    server = HttpServer(app, limits=limits)
    following = None
    if follower is not None:
        follower.poll()  # the replica table and deployments before the first request
        following = asyncio.create_task(follower.run(), name="router-follow")
    await server.start(host, port)
    prober.start()
    if publisher is not None:
        publisher.start()
    try:
        await stop.wait()
    finally:
        if publisher is not None:
            await publisher.close()
        await server.close()
        await app.close_shadows()
        await prober.close()
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        router.close()


def static_fleet(
    replicas: Sequence[str], concurrency: int
) -> tuple[list[DeploymentDesired], list[ReplicaStatus]]:
    """``name=url`` pairs → deployments and ready replicas."""
    deployments: dict[str, DeploymentDesired] = {}
    statuses: list[ReplicaStatus] = []
    for i, item in enumerate(replicas):
        name, _, url = item.partition("=")
        deployments.setdefault(
            name,
            DeploymentDesired(
                name=name,
                spec=RevisionSpec(model_id=name, revision="static"),
                quota=ReplicaQuota(min=0, max=len(replicas)),
                autoscaling=AutoscalingPolicy(target_concurrency=concurrency),
            ),
        )
        statuses.append(
            ReplicaStatus(
                replica_id=f"{name}-{i}",
                deployment=name,
                revision="static",
                state="ready",
                endpoint=url,
            )
        )
    return list(deployments.values()), statuses


@dataclass(frozen=True)
class LoadReports:
    """Where the router publishes its plane's load for the gateways."""

    cluster: str
    nats_url: str
    credentials: NatsCredentials | None
    interval_s: float = 0.5


def run_plane(
    host: str,
    port: int,
    state_dir: Path,
    config: RouterConfig,
    reports: LoadReports | None = None,
) -> None:
    """Serve the plane whose agent keeps its state in ``state_dir`` until SIGTERM or SIGINT:
    the replica table from the runtime's record, deployments from the last snapshot; with
    ``reports``, publish the plane's load on NATS."""
    router = Router(config)

    async def run() -> None:
        follower = PlaneFollower(router, state_dir)
        recent = RecentWindow()
        publisher = _publisher(router, recent, reports)
        await serve_router(
            router,
            host,
            port,
            stop_on_signals(),
            follower=follower,
            recent=recent,
            publisher=publisher,
        )

    run_fast(run())


def run_static(
    host: str,
    port: int,
    replicas: Sequence[str],
    concurrency: int,
    config: RouterConfig,
    reports: LoadReports | None = None,
) -> None:
    """Serve the ``name=url`` replicas until SIGTERM or SIGINT (uvloop when installed)."""
    router = Router(config)
    deployments, statuses = static_fleet(replicas, concurrency)
    router.set_deployments(deployments)
    router.set_replicas(statuses)

    async def run() -> None:
        recent = RecentWindow()
        publisher = _publisher(router, recent, reports)
        await serve_router(
            router, host, port, stop_on_signals(), recent=recent, publisher=publisher
        )

    run_fast(run())


def _publisher(
    router: Router, recent: RecentWindow, reports: LoadReports | None
) -> LoadPublisher | None:
    if reports is None:
        return None
    return LoadPublisher(
        reports.cluster,
        reports.nats_url,
        reports.credentials,
        router,
        recent,
        interval_s=reports.interval_s,
        clock=router.clock,
    )


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run_fast(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
