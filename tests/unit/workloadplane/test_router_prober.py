"""The prober on loopback replicas: each replica is probed on its own cadence, so a hung
replica is out within the hung deadline even while another replica answers slowly (a shared
round of probes lasted as long as its slowest answer: 2.2–2.5 s ejections under load)."""

from __future__ import annotations

import asyncio
import time

from controlplane.contracts import ReplicaStatus
from tests.unit.workloadplane.builders import make_deployment
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.prober import Prober
from workloadplane.runtime.process import free_port


class HealthServer:
    """Answers GET /health (and /v1/models) after ``delay_s``; once ``hung``, never again."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.hung, self.answered = delay_s, False, asyncio.Event()
        self.port = free_port()

    async def start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head:
                return
            if self.hung:
                await asyncio.Event().wait()
            await asyncio.sleep(self.delay_s)
            body = b'{"data": []}' if head.startswith(b"GET /v1/models") else b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
            await writer.drain()
            if head.startswith(b"GET /health"):
                self.answered.set()


def replica(rid: str, port: int) -> ReplicaStatus:
    return ReplicaStatus(replica_id=rid, deployment="chat", revision="r1", state="ready",
                         endpoint=f"http://127.0.0.1:{port}")  # fmt: skip


async def test_a_hung_replica_is_out_within_the_deadline_beside_a_slow_one():
    slow, victim = HealthServer(delay_s=0.9), HealthServer()
    servers = [await slow.start(), await victim.start()]
    config = RouterConfig(models_refresh_s=3600)
    router = Router(config)
    router.set_deployments([make_deployment("chat")])
    router.set_replicas([replica("slow", slow.port), replica("victim", victim.port)])
    prober = Prober(router, RouterMetrics())
    prober.start()
    try:
        await asyncio.wait_for(slow.answered.wait(), 5)  # a round with the slow answer
        victim.answered.clear()
        await asyncio.wait_for(victim.answered.wait(), 5)
        victim.hung, stopped = True, time.monotonic()  # right after a good probe: worst case
        backend = router.backends["victim"]
        async with asyncio.timeout(5):
            while not backend.health.ejected:
                await asyncio.sleep(0.01)
        ejected_after = time.monotonic() - stopped
    finally:
        await prober.close()
        router.close()
        for server in servers:
            server.close()
    assert ejected_after <= config.hung_deadline_s + 0.25, ejected_after
    assert not router.backends["slow"].health.ejected
