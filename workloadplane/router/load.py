"""What a plane tells the gateways about its load: a rolling window of recent requests and
the pure step from the router's state to a ``PlaneLoad`` report.

``RecentWindow`` keeps, per deployment, the completion times and time-to-first-token of the
requests answered in the last ``window_s`` seconds (bounded: at most ``max_samples`` each);
``plane_load`` turns the router's table (ready/starting replicas, in flight, queued, the
concurrency limit) and that window into the report. The clock is passed in.
"""

from __future__ import annotations

import collections
import statistics

from controlplane.contracts import DeploymentLoad, PlaneLoad
from workloadplane.router.core import Router


class RecentWindow:
    """Recent completions per deployment: (time, ttft or None). A deployment whose last
    completion left the window is forgotten (once per window): its summary is empty either
    way, and each rollout lane's name would otherwise stay for good."""

    def __init__(self, window_s: float = 10.0, max_samples: int = 4096) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self._done: dict[str, collections.deque[tuple[float, float | None]]] = {}
        self._swept_at = float("-inf")

    def finished(self, deployment: str, now: float, ttft_s: float | None) -> None:
        samples = self._done.get(deployment)
        if samples is None:
            samples = self._done[deployment] = collections.deque(maxlen=self.max_samples)
        samples.append((now, ttft_s))
        if now - self._swept_at >= self.window_s:
            self._swept_at = now
            cutoff = now - self.window_s
            for name in [n for n, s in self._done.items() if not s or s[-1][0] < cutoff]:
                del self._done[name]

    def summary(self, deployment: str, now: float) -> tuple[float | None, float]:
        """(median TTFT, completions per second) over the window ending at ``now``."""
        samples = self._done.get(deployment)
        if not samples:
            return None, 0.0
        while samples and samples[0][0] < now - self.window_s:
            samples.popleft()
        if not samples:
            return None, 0.0
        ttfts = [t for _, t in samples if t is not None]
        span = min(self.window_s, max(now - samples[0][0], 1.0))
        median = statistics.median(ttfts) if ttfts else None
        return median, len(samples) / span


def plane_load(
    router: Router,
    window: RecentWindow,
    cluster: str,
    *,
    sequence: int,
    interval_s: float,
    now: float,
) -> PlaneLoad:
    """The plane's load report as its router sees it at ``now`` (``now`` on the window's
    clock)."""
    deployments = []
    for name, entry in router.deployments.items():
        if entry.serves:
            continue  # a rollout lane: counted in the deployment it serves, below
        # a canary lane takes part of the deployment's traffic on its own replicas: the
        # gateways see one deployment (a shadow's copies are not the users' load)
        sides = [entry, *router.lanes_of(name)]
        ready = sum(1 for e in sides for b in e.backends.values() if b.routable)
        starting = sum(1 for e in sides for b in e.backends.values() if b.state == "starting")
        ttft, rate = window.summary(name, now)
        rate += sum(window.summary(e.name, now)[1] for e in sides[1:])
        deployments.append(
            DeploymentLoad(
                name=name,
                ready_replicas=ready,
                starting_replicas=starting,
                in_flight=sum(e.in_flight() for e in sides),
                queue_depth=sum(len(e.queue) for e in sides),
                capacity=sum(
                    e.limit * sum(1 for b in e.backends.values() if b.routable) for e in sides
                ),
                ttft_seconds=ttft,
                service_rate=rate,
            )
        )
    return PlaneLoad(
        cluster=cluster,
        source=f"cluster/{cluster}",
        sequence=sequence,
        interval_seconds=interval_s,
        deployments=deployments,
    )
