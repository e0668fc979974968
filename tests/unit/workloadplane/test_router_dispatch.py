"""The dispatcher's retry policy on loopback replicas: a 503 or a refused connection before
any byte ejects that replica and retries on another; on the last attempt the replica's
status, or the last error, is the answer; the slot is freed in every case."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.router.core import Router, RouterConfig, Ticket
from workloadplane.router.dispatch import Dispatcher, Forward
from workloadplane.router.httpserver import HttpServer
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.upstream import UpstreamError
from workloadplane.runtime.process import free_port


def replica_app(status: int):
    async def app(scope, receive, send) -> None:
        await receive()
        body = b"from %d" % status
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


@contextlib.asynccontextmanager
async def replicas(*statuses: int | None) -> AsyncIterator[list[str]]:
    """One loopback replica per status (None: a port nobody listens on); their URLs."""
    servers, urls = [], []
    for status in statuses:
        port = free_port()
        if status is not None:
            server = HttpServer(replica_app(status))
            await server.start("127.0.0.1", port)
            servers.append(server)
        urls.append(f"http://127.0.0.1:{port}")
    try:
        yield urls
    finally:
        for server in servers:
            await server.close(grace_s=1)


def plane(urls: list[str], **config) -> tuple[Router, Dispatcher, RouterMetrics]:
    router = Router(RouterConfig(queue_max_wait_s=0.5, **config))
    router.set_deployments(
        [
            DeploymentDesired(
                name="chat",
                spec=RevisionSpec(model_id="chat", revision="r1"),
                quota=ReplicaQuota(min=0, max=len(urls)),
                autoscaling=AutoscalingPolicy(target_concurrency=4),
            )
        ]
    )
    router.set_replicas(
        [
            ReplicaStatus(
                replica_id=f"r{i}", deployment="chat", revision="r1", state="ready", endpoint=url
            )
            for i, url in enumerate(urls)
        ]
    )
    metrics = RouterMetrics()
    return router, Dispatcher(router, metrics), metrics


REQUEST = Forward("/v1/completions", [], b'{"model": "chat"}', stream=False)


def never_gone() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def retries(metrics: RouterMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "gpufleet_router_retries_total", {"deployment": "chat", "reason": reason}
    )
    return value or 0.0


async def test_a_503_ejects_that_replica_and_the_request_goes_to_another():
    async with replicas(503, 200) as urls:
        router, dispatcher, metrics = plane(urls)
        ticket = Ticket(tier=1, tried={"r1"})  # r0 first: the failing one
        exchange = await dispatcher.dispatch(
            router.deployments["chat"], ticket, REQUEST, never_gone
        )
        assert exchange.response.status == 200
        assert await exchange.response.read() == b"from 200"
        exchange.close()
        assert router.backends["r0"].health.ejected
        assert not router.backends["r1"].health.ejected
        assert retries(metrics, "status_503") == 1
        assert router.load("chat") == (0, 0), "every slot is freed"
        router.close()


async def test_a_refused_connection_is_retried_elsewhere():
    async with replicas(None, 200) as urls:
        router, dispatcher, metrics = plane(urls)
        ticket = Ticket(tier=1, tried={"r1"})
        exchange = await dispatcher.dispatch(
            router.deployments["chat"], ticket, REQUEST, never_gone
        )
        assert exchange.response.status == 200
        exchange.close()
        assert router.backends["r0"].health.ejected
        assert retries(metrics, "before_first_byte") == 1
        router.close()


async def test_when_every_attempt_fails_the_last_status_is_the_answer():
    """502/503/504 on the last attempt is relayed as it is (the client sees the replica's
    answer); with max_attempts=2 and two failing replicas, one retry happens."""
    async with replicas(503, 502) as urls:
        router, dispatcher, metrics = plane(urls, max_attempts=2)
        ticket = Ticket(tier=1, tried={"r1"})
        exchange = await dispatcher.dispatch(
            router.deployments["chat"], ticket, REQUEST, never_gone
        )
        assert exchange.response.status == 502
        exchange.close()
        assert retries(metrics, "status_503") == 1
        assert router.load("chat") == (0, 0)
        router.close()


async def test_refused_everywhere_raises_the_last_upstream_error():
    async with replicas(None) as urls:
        router, dispatcher, _ = plane(urls, max_attempts=1)
        with pytest.raises(UpstreamError, match="connect"):
            await dispatcher.dispatch(
                router.deployments["chat"], Ticket(tier=1), REQUEST, never_gone
            )
        assert router.load("chat") == (0, 0)
        router.close()
