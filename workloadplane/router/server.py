"""Running the router: inside the agent's event loop, or standalone on static backends.

``serve_router`` is the router's composition root: metrics, dispatcher, prober and the HTTP
app are built here and handed to each other. ``gpufleet router --port 8080 --replica
chat=http://127.0.0.1:8001 ...`` (``workloadplane/cli.py``) serves fixed replicas
(benchmarks, demos); the agent instead feeds the router from its runtime and desired state
(``gpufleet agent --router-port``).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.router.app import RouterApp
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.dispatch import Dispatcher
from workloadplane.router.httpserver import HttpServer
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.prober import Prober


async def serve_router(
    router: Router,
    host: str,
    port: int,
    stop: asyncio.Event,
    also_metrics: Sequence[CollectorRegistry] = (),
) -> None:
    """Serve ``router`` on ``host:port`` (and probe its replicas) until ``stop`` is set;
    ``/metrics`` serves ``also_metrics`` beside the router's own."""
    metrics = RouterMetrics(also_metrics)
    prober = Prober(router, metrics)
    server = HttpServer(RouterApp(router, Dispatcher(router, metrics), metrics))
    await server.start(host, port)
    prober.start()
    try:
        await stop.wait()
    finally:
        await server.close()
        await prober.close()
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


def run_static(
    host: str, port: int, replicas: Sequence[str], concurrency: int, queue_max_wait_s: float
) -> None:
    """Serve the ``name=url`` replicas until SIGTERM or SIGINT (uvloop when installed)."""
    router = Router(RouterConfig(queue_max_wait_s=queue_max_wait_s))
    deployments, statuses = static_fleet(replicas, concurrency)
    router.set_deployments(deployments)
    router.set_replicas(statuses)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_router(router, host, port, stop)

    try:
        import uvloop
    except ImportError:
        asyncio.run(run())
    else:
        uvloop.run(run())
