"""Active probes of every plane's router: ``GET /health`` every ``interval_s`` (each plane on
its own cadence), ``timeout_s`` to answer. A failed or late probe takes the plane out of
rotation (``hung``: its streams silent for ``stream_stall_s``, 1 s, are cut and continue
elsewhere), so a hung plane is out within ``interval_s + timeout_s`` (0.25 + 0.5 s) and its
streams move within about 1.5 s — unless a stream from it delivered bytes since the probe
was sent (``GatewayState.probe_failed``: alive, only slow to answer /health); two good ones
bring it back. Each good
probe's round trip is the plane's measured RTT (smoothed), which replaces the time-zone
latency model in the choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from workloadplane.gateway.state import GatewayState, Plane
from workloadplane.router.upstream import UpstreamError

log = logging.getLogger(__name__)


class PlaneProber:
    def __init__(
        self, state: GatewayState, *, interval_s: float = 0.25, timeout_s: float = 0.5
    ) -> None:
        self.state = state
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None

    async def probe(self, plane: Plane) -> None:
        timeout = self.timeout_s
        began, sent_at = time.perf_counter(), self.state.clock()
        try:
            resp = await plane.pool.request(
                "GET", "/health", head_timeout=timeout, connect_timeout=timeout
            )
            await resp.read_within(timeout)  # a body that stalls: its connection is closed
            if resp.status != 200:
                raise UpstreamError(f"/health answered {resp.status}", before_first_byte=True)
        except (UpstreamError, TimeoutError) as exc:
            self.state.probe_failed(plane.cluster, f"health probe: {exc or 'timed out'}", sent_at)
            return
        self.state.probe_ok(plane.cluster, time.perf_counter() - began)

    async def run(self) -> None:
        running: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                for cluster, plane in list(self.state.planes.items()):
                    task = running.get(cluster)
                    if task is None or task.done():
                        running[cluster] = asyncio.create_task(self._logged(plane))
                for cluster in [c for c, t in running.items() if c not in self.state.planes]:
                    if running[cluster].done():
                        del running[cluster]
                await asyncio.sleep(self.interval_s)
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    async def _logged(self, plane: Plane) -> None:
        try:
            await self.probe(plane)
        except Exception:  # the prober must outlive any one probe
            log.exception("probing plane %s failed", plane.cluster)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="gateway-probes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
