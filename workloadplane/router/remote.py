"""The agent's view of the plane's router when the router runs in a process of its own.

A ``Router`` used as a table only (never serves): the agent feeds it deployments and
replicas as it would an in-process router, so the autoscaler finds the replicas to scrape
and the concurrency limits where it always did. What only the router process knows — in
flight per replica and deployment, queue depth, deployments waiting at zero — is read from
its ``GET /internal/load`` on loopback every ``interval_s`` (``follow``): scale-from-zero
wake-ups, drains and the autoscaler's signals keep working across the process boundary.

Drains: a replica the runtime has marked ``draining`` counts as busy until the router's
report shows it draining too (the router learns it from the runtime's record a moment
later), so a drain never stops a replica the router may still send a request to.

A report older than ``stale_after_s`` (the router is down, restarting or stalled) is not
taken for an idle plane: ``fresh`` is False, ``replica_in_flight`` says None (unknown: a
drain keeps waiting, up to its deadline) and the autoscaler holds, with no decision and no
sample. ``load`` then says (0, 0) for the heartbeat's counts only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from controlplane.contracts import OutcomeCounters, TokenCounters, loads
from workloadplane.router.core import Clock, Router, RouterConfig
from workloadplane.router.upstream import UpstreamError, UpstreamPool

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Seen:
    in_flight: int
    state: str


MALFORMED = (ValueError, KeyError, TypeError, AttributeError)
"""What ``apply_report`` raises for an answer of the wrong shape."""


class RemoteRouter(Router):
    def __init__(
        self,
        host: str,
        port: int,
        config: RouterConfig | None = None,
        clock: Clock = time.monotonic,
        *,
        interval_s: float = 0.1,
        stale_after_s: float = 2.0,
    ) -> None:
        super().__init__(config, clock)
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s
        self._pool = UpstreamPool(host, port, max_idle=1)
        self._deployments: dict[str, tuple[int, int]] = {}
        self._counters: dict[str, TokenCounters] = {}
        self._outcome_counters: dict[str, OutcomeCounters] = {}
        self._replicas: dict[str, _Seen] = {}
        self._at = float("-inf")
        self._unreachable = False

    def apply_report(self, report: dict, now: float) -> None:
        """Take one ``/internal/load`` answer (``Router.load_report``): all of it or, when
        it is not of that shape (KeyError, TypeError, AttributeError, ValueError), none."""
        deployments = {
            name: (int(d["in_flight"]), int(d["queued"]))
            for name, d in report["deployments"].items()
        }
        replicas = {
            rid: _Seen(int(r["in_flight"]), str(r["state"]))
            for rid, r in report["replicas"].items()
        }
        counters = {
            name: TokenCounters.model_validate(u) for name, u in report.get("usage", {}).items()
        }
        outcomes = {
            name: OutcomeCounters.model_validate(o)
            for name, o in report.get("outcomes", {}).items()
        }
        at_zero = [name for name, d in report["deployments"].items() if d.get("at_zero")]
        self._deployments, self._replicas = deployments, replicas
        self._counters, self._outcome_counters = counters, outcomes
        self._at = now
        for name in at_zero:
            self.scale_from_zero.add(name)

    @property
    def fresh(self) -> bool:
        """The last report is at most ``stale_after_s`` old."""
        return self.clock() - self._at <= self.stale_after_s

    def load(self, deployment: str) -> tuple[int, int]:
        return self._deployments.get(deployment, (0, 0)) if self.fresh else (0, 0)

    def usage(self, deployment: str) -> TokenCounters | None:
        """The router process's counters as last read (kept while it does not answer: they
        are counters, the next report carries on from them)."""
        return self._counters.get(deployment)

    def outcomes(self, deployment: str) -> OutcomeCounters | None:
        """The router process's outcome counters as last read (kept, like ``usage``)."""
        return self._outcome_counters.get(deployment)

    def replica_in_flight(self, replica_id: str) -> int | None:
        if not self.fresh:
            return None  # a router that does not answer may still be serving requests
        seen = self._replicas.get(replica_id)
        if seen is None:
            return 0
        mine = self.backends.get(replica_id)
        if mine is not None and mine.state == "draining" and seen.state != "draining":
            return max(seen.in_flight, 1)  # the router may still send it a request
        return seen.in_flight

    async def poll(self) -> None:
        """One read of the router's load (raises ``UpstreamError``/``TimeoutError``/
        ``ValueError`` when it does not answer well)."""
        resp = await self._pool.request(
            "GET", "/internal/load", head_timeout=1.0, connect_timeout=1.0
        )
        body = await resp.read_within(1.0)
        if resp.status != 200:
            raise ValueError(f"/internal/load answered {resp.status}")
        self.apply_report(loads(body), self.clock())

    async def follow(self) -> None:
        """Poll every ``interval_s`` until cancelled; an unreachable router is logged once."""
        while True:
            try:
                await self.poll()
            except (
                UpstreamError,
                TimeoutError,
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
            ) as exc:
                # a wrong-shaped answer (a list, a null) too: the poller must outlive it
                if not self._unreachable:
                    log.warning("the plane's router does not answer /internal/load: %s", exc)
                self._unreachable = True
            else:
                if self._unreachable:
                    log.info("the plane's router answers again")
                self._unreachable = False
            await asyncio.sleep(self.interval_s)

    def close(self) -> None:
        super().close()
        self._pool.close()
