"""Active health probes: ``GET /health`` on every ready or draining replica each
``probe_interval_s``. A probe that fails or times out ejects the replica (its requests that
got no byte are retried elsewhere, the streams flowing from it end with an error event, so
a hung replica holds nothing longer than ``hung_deadline_s``); ``readmit_after`` good probes
in a row readmit it. A healthy replica's ``/v1/models`` is re-read every ``models_refresh_s``
(LoRA adapters), apart from its health probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from controlplane.contracts import loads
from workloadplane.router.core import Backend, Router
from workloadplane.router.metrics import RouterMetrics
from workloadplane.router.upstream import UpstreamError

log = logging.getLogger(__name__)


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
            await resp.read_within(timeout)
            if resp.status != 200:
                raise UpstreamError(f"/health answered {resp.status}", before_first_byte=True)
        except (UpstreamError, TimeoutError) as exc:
            if self.router.eject(backend, f"health probe: {exc or 'timed out'}", hung=True):
                self.metrics.ejected(backend.deployment, backend.replica_id)
            return
        self.router.probe_ok(backend)

    async def _probe_logged(self, backend: Backend) -> None:
        try:
            await self.probe(backend)
        except Exception:  # the prober must outlive any one probe
            log.exception("probing %s failed", backend.replica_id)

    async def _refresh_models(self, backend: Backend) -> None:
        """Re-read ``/v1/models``; a task of its own, so a slow answer never delays the
        replica's next health probe."""
        with contextlib.suppress(UpstreamError, TimeoutError, ValueError, KeyError, TypeError):
            resp = await backend.pool.request("GET", "/v1/models", head_timeout=2.0)
            data = loads(await resp.read_within(2.0))
            self.router.set_models(backend, frozenset(m["id"] for m in data["data"]))

    async def run(self) -> None:
        """Every ``probe_interval_s`` start a probe of each replica whose last one has
        ended: each replica on its own cadence, so one slow answer delays no other replica's
        probe and a hung replica is out within ``hung_deadline_s`` (interval + timeout)."""
        running: dict[str, asyncio.Task[None]] = {}
        refreshing: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                now = self.router.clock()
                targets = [
                    b for b in self.router.backends.values() if b.state in ("ready", "draining")
                ]
                for b in targets:
                    task = running.get(b.replica_id)
                    if task is None or task.done():
                        running[b.replica_id] = asyncio.create_task(self._probe_logged(b))
                    task = refreshing.get(b.replica_id)
                    due = now - b.models_at >= self.config.models_refresh_s
                    if due and b.serving and (task is None or task.done()):
                        refreshing[b.replica_id] = asyncio.create_task(self._refresh_models(b))
                wanted = {b.replica_id for b in targets}
                for tasks in (running, refreshing):
                    for rid in [r for r, t in tasks.items() if r not in wanted and t.done()]:
                        del tasks[rid]
                await asyncio.sleep(self.config.probe_interval_s)
        finally:
            pending = [*running.values(), *refreshing.values()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="router-probes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
