"""Active health probes: ``GET /health`` on every ready or draining replica each
``probe_interval_s``. A probe that fails or times out ejects the replica (its requests that
got no byte are retried elsewhere, the streams flowing from it end with an error event, so
a hung replica holds nothing longer than ``hung_deadline_s``); ``readmit_after`` good probes in a row readmit it. A
healthy replica's ``/v1/models`` is re-read every ``models_refresh_s`` (LoRA adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from workloadplane.router.core import Backend, Router
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.upstream import UpstreamError


class Prober:
    def __init__(self, router: Router, metrics: RouterMetrics) -> None:
        self.router = router
        self.metrics = metrics
        self.config = router.config
        self._task: asyncio.Task[None] | None = None

    async def probe(self, backend: Backend) -> None:
        """One probe of ``backend``: eject on failure, count a good probe otherwise."""
        timeout = self.config.probe_timeout_s
        try:
            resp = await backend.pool.request(
                "GET", "/health", head_timeout=timeout, connect_timeout=timeout
            )
            await asyncio.wait_for(resp.read(), timeout)
            resp.release()
            if resp.status != 200:
                raise UpstreamError(f"/health answered {resp.status}", before_first_byte=True)
        except (UpstreamError, TimeoutError) as exc:
            if self.router.eject(backend, f"health probe: {exc or 'timed out'}", hung=True):
                self.metrics.ejected(backend.deployment, backend.replica_id)
            return
        if self.router.clock() - backend.models_at >= self.config.models_refresh_s:
            await self._refresh_models(backend)
        self.router.probe_ok(backend)

    async def _refresh_models(self, backend: Backend) -> None:
        with contextlib.suppress(UpstreamError, TimeoutError, ValueError, KeyError, TypeError):
            resp = await backend.pool.request("GET", "/v1/models", head_timeout=2.0)
            data = json.loads(await asyncio.wait_for(resp.read(), 2.0))
            resp.release()
            self.router.set_models(backend, frozenset(m["id"] for m in data["data"]))

    async def run(self) -> None:
        while True:
            targets = [b for b in self.router.backends.values() if b.state in ("ready", "draining")]
            if targets:
                await asyncio.gather(*(self.probe(b) for b in targets), return_exceptions=True)
            await asyncio.sleep(self.config.probe_interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="router-probes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
