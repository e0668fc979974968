"""Running the router: inside the agent's event loop, or standalone on static backends.

``python -m workloadplane.router --port 8080 --replica chat=http://127.0.0.1:8001 ...``
serves fixed replicas (benchmarks, demos); the agent instead feeds the router from its
runtime and desired state (``gpufleet agent --router-port``).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.router.app import RouterApp
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.httpserver import HttpServer


async def serve_router(router: Router, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve ``router`` on ``host:port`` until ``stop`` is set."""
    server = HttpServer(RouterApp(router))
    await server.start(host, port)
    router.start()
    try:
        await stop.wait()
    finally:
        await server.close()
        await router.close()


def static_fleet(replicas: Sequence[str], concurrency: int) -> tuple[list[DeploymentDesired],
                                                                     list[ReplicaStatus]]:  # fmt: skip
    """``name=url`` pairs → deployments and ready replicas."""
    deployments: dict[str, DeploymentDesired] = {}
    statuses: list[ReplicaStatus] = []
    for i, item in enumerate(replicas):
        name, _, url = item.partition("=")
        deployments.setdefault(name, DeploymentDesired(
            name=name, spec=RevisionSpec(model_id=name, revision="static"),
            quota=ReplicaQuota(min=0, max=len(replicas)),
            autoscaling=AutoscalingPolicy(target_concurrency=concurrency),
        ))  # fmt: skip
        statuses.append(ReplicaStatus(replica_id=f"{name}-{i}", deployment=name,
                                      revision="static", state="ready", endpoint=url))  # fmt: skip
    return list(deployments.values()), statuses


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpufleet-router")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--replica", action="append", default=[], help="deployment=url")
    parser.add_argument("--concurrency", type=int, default=256, help="per-replica limit")
    parser.add_argument("--queue-max-wait", type=float, default=120.0)
    args = parser.parse_args(argv)
    router = Router(RouterConfig(queue_max_wait_s=args.queue_max_wait))
    deployments, replicas = static_fleet(args.replica, args.concurrency)
    router.set_deployments(deployments)
    router.set_replicas(replicas)

    async def run() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_router(router, args.host, args.port, stop)

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
