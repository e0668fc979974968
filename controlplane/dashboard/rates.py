"""Request rates from cumulative counters: the API process keeps a few timed scrapes per router
and turns the oldest and newest within a window into requests per second.

`rate` is pure (samples in, rate out); `RequestRates` is the process's memory of scrapes, fed
the clock by its caller. One scrape gives no rate ("—" on the page); a counter that went down
(the router restarted) counts from zero, as Prometheus' `rate()` does. Each API worker keeps
its own memory: a rate appears once that worker has scraped twice."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

WINDOW_S = 60.0
MIN_GAP_S = 1.0
"""Scrapes closer than this to the newest are not taken (the page reuses the newest)."""


@dataclass(frozen=True)
class Sample:
    at: float
    """the caller's clock (seconds)"""
    counts: Mapping[str, float]
    """deployment → requests so far"""


def rate(samples: list[Sample], deployment: str) -> float | None:
    """Requests per second of a deployment between the first and last sample; None with fewer
    than two samples or no time between them."""
    if len(samples) < 2 or samples[-1].at <= samples[0].at:
        return None
    total = 0.0
    for before, after in itertools.pairwise(samples):
        was, now = before.counts.get(deployment, 0.0), after.counts.get(deployment, 0.0)
        total += now - was if now >= was else now
    return total / (samples[-1].at - samples[0].at)


def kept(samples: list[Sample], now: float, window_s: float = WINDOW_S) -> list[Sample]:
    """The samples worth keeping at `now`: those inside the window, plus the newest one before
    it (so a rate spans the whole window, or the gap since the last scrape when scrapes are
    sparse)."""
    inside = [s for s in samples if s.at >= now - window_s]
    before = [s for s in samples if s.at < now - window_s]
    return before[-1:] + inside


class RequestRates:
    """Per router, the scrapes of the last WINDOW_S; thread-safe (pages run in a thread pool)."""

    def __init__(self, clock: Callable[[], float], window_s: float = WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._samples: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()

    def due(self, routers: list[str]) -> list[str]:
        """The routers whose newest scrape is MIN_GAP_S old or more (or that have none)."""
        now = self._clock()
        with self._lock:
            return [
                r
                for r in routers
                if not self._samples.get(r) or now - self._samples[r][-1].at >= MIN_GAP_S
            ]

    def record(self, router: str, counts: Mapping[str, float]) -> None:
        now = self._clock()
        with self._lock:
            samples = [*self._samples.get(router, ()), Sample(now, dict(counts))]
            self._samples[router] = deque(kept(samples, now, self._window_s))

    def per_deployment(self, routers: list[str], deployments: list[str]) -> dict[str, float]:
        """Deployment → requests/s summed over the routers that have a rate; a deployment no
        router has a rate for is left out."""
        with self._lock:
            histories = [list(self._samples.get(r, ())) for r in routers]
        out: dict[str, float] = {}
        for name in deployments:
            found = [v for h in histories if (v := rate(h, name)) is not None]
            if found:
                out[name] = sum(found)
        return out
