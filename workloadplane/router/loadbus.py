"""The router process publishes its plane's load for the gateways (core NATS, >= 1 Hz).

Why the router and not the agent: the router is the plane's data path, so its report is the
data path's own state (in flight, queue depth, recent TTFT and service rate it measured), and
it stops exactly when the data path stops. An agent crash or upgrade, which costs no request
(docs/router.md), then also moves no traffic away at the gateways. It connects with the
cluster's NATS credentials (the agent's; the cluster user may publish under its own
``gpufleet.v1.cluster.<name>.>``), publishes only, and never lets NATS trouble reach the
data path: a report that cannot be sent is dropped (the next one replaces it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.aio.client import Client

from controlplane.contracts import NatsCredentials, encode, plane_load_subject
from workloadplane.natsconnect import connect_until_up
from workloadplane.router.core import Clock, Router
from workloadplane.router.load import RecentWindow, plane_load

log = logging.getLogger(__name__)


class LoadPublisher:
    def __init__(
        self,
        cluster: str,
        servers: str | list[str],
        credentials: NatsCredentials | None,
        router: Router,
        window: RecentWindow,
        *,
        interval_s: float = 0.5,
        clock: Clock = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.subject = plane_load_subject(cluster)
        self._servers = servers
        self._credentials = credentials
        self._router, self._window = router, window
        self.interval_s = interval_s
        self._clock = clock
        self._nc: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self.sequence = 0
        self.published = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="router-load-publisher")

    async def _connect(self) -> Client:
        return await connect_until_up(
            self._servers,
            f"gpufleet-router-{self.cluster}",
            self._credentials,
            why_waiting="serving on, load reports once it is back",
        )

    async def _run(self) -> None:
        self._nc = await self._connect()
        while True:
            await self.publish_once()
            await asyncio.sleep(self.interval_s)

    async def publish_once(self) -> None:
        """Publish one report now if connected (core NATS: buffered, never blocks)."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            return
        self.sequence += 1
        report = plane_load(
            self._router,
            self._window,
            self.cluster,
            sequence=self.sequence,
            interval_s=self.interval_s,
            now=self._clock(),
        )
        try:
            await nc.publish(self.subject, encode(report))
            self.published += 1
        except Exception as exc:
            log.debug("load report not published: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
