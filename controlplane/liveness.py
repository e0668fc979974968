"""Cluster liveness from heartbeat times: pure functions, the clock is passed in.

Silence only counts while the control plane could have heard: a cluster's silence is
measured up to the *evidence horizon* — the newest moment before which the bus process has
processed every report the stream received (`caught_up_at`) — never up to the wall clock.
A frozen, dead or lagging bus process stops the horizon, so its blind spot is never taken
for the planes' death. A circuit breaker suspects ourselves when most clusters go silent
at once: no cluster is declared down until heartbeats flow again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

Liveness = Literal["healthy", "stale", "down"]


def cluster_liveness(
    last_heartbeat: datetime | None,
    now: datetime,
    stale_after: timedelta,
    down_after: timedelta,
) -> Liveness:
    """``healthy`` until ``stale_after`` without a heartbeat, ``stale`` until ``down_after``,
    then ``down``. A cluster that never sent a heartbeat is ``down``."""
    if down_after < stale_after:
        raise ValueError("down_after must be >= stale_after")
    if last_heartbeat is None:
        return "down"
    silence = now - last_heartbeat
    if silence >= down_after:
        return "down"
    if silence >= stale_after:
        return "stale"
    return "healthy"


def liveness_changes(
    previous: Mapping[str, Liveness],
    last_heartbeats: Mapping[str, datetime | None],
    now: datetime,
    stale_after: timedelta,
    down_after: timedelta,
) -> dict[str, tuple[Liveness | None, Liveness]]:
    """Clusters whose liveness differs from ``previous``: name → (old, new).

    The caller records an event for each change and re-plans on ``down``.
    """
    changes: dict[str, tuple[Liveness | None, Liveness]] = {}
    for cluster, beat in last_heartbeats.items():
        new = cluster_liveness(beat, now, stale_after, down_after)
        old = previous.get(cluster)
        if old != new:
            changes[cluster] = (old, new)
    return changes


# --- what the bus process could have received ----------------------------------------------


@dataclass
class CatchUp:
    """The bus process's bookkeeping of how far it has processed the reports stream.

    Every few seconds it `observe`s the stream's last sequence and its consumer's ack floor
    (every message up to it acked or terminated). A sample `(t, last_seq)` with
    `last_seq <= ack_floor` proves that everything the stream held at `t` was processed:
    `caught_up_at` is the newest such `t`. Samples older than it are dropped.
    """

    caught_up_at: datetime | None = None
    samples: list[tuple[datetime, int]] = field(default_factory=list)

    def observe(self, at: datetime, stream_last_seq: int, ack_floor: int) -> datetime | None:
        self.samples.append((at, stream_last_seq))
        done = [t for t, seq in self.samples if seq <= ack_floor]
        if done:
            self.caught_up_at = max(done + ([self.caught_up_at] if self.caught_up_at else []))
            self.samples = [(t, seq) for t, seq in self.samples if t > self.caught_up_at]
        return self.caught_up_at


@dataclass(frozen=True)
class BusProgress:
    """What the bus process last wrote: when it was alive, up to when it had processed
    everything, and how many reports waited for it."""

    alive_at: datetime
    caught_up_at: datetime | None
    pending: int = 0


def evidence_horizon(
    now: datetime, progress: BusProgress | None, stale_after: timedelta
) -> tuple[datetime, str | None]:
    """Up to when silence counts, and why it stops before ``now`` (None: it does not).

    Without any bookkeeping (no bus process ever wrote progress) silence counts up to
    ``now``, as before. The horizon is "behind" only once it lags by ``stale_after``: a
    few seconds between two progress writes are normal.
    """
    if progress is None:
        return now, None
    if progress.caught_up_at is None:  # alive, but never through the backlog yet
        return now, "the bus process has not caught up with the reports stream since it started"
    horizon = min(now, progress.caught_up_at)
    lag = now - horizon
    if lag < stale_after:
        return horizon, None
    alive = (now - progress.alive_at).total_seconds()
    if alive >= stale_after.total_seconds():
        why = f"the bus process has shown no progress for {alive:.0f} s (frozen or dead)"
    else:
        why = (
            f"the bus process is {lag.total_seconds():.0f} s behind the reports stream "
            f"({progress.pending} report(s) pending)"
        )
    return horizon, why


@dataclass(frozen=True)
class Breaker:
    """Suspect ourselves when a cluster would go down while at least ``min_clusters`` and
    ``fraction`` of the tracked clusters (heard from, not down already) are silent."""

    fraction: float = 0.5
    min_clusters: int = 2

    def trips(self, going_down: int, tracked: int) -> bool:
        return (
            tracked > 0
            and going_down >= self.min_clusters
            and going_down >= self.fraction * tracked
        )


@dataclass(frozen=True)
class Verdict:
    """The transitions to record, and why liveness is suspended (None: it is not)."""

    changes: dict[str, tuple[Liveness | None, Liveness]]
    suspended: str | None = None


def judge(
    previous: Mapping[str, Liveness],
    last_heartbeats: Mapping[str, datetime | None],
    now: datetime,
    stale_after: timedelta,
    down_after: timedelta,
    progress: BusProgress | None = None,
    breaker: Breaker | None = None,
) -> Verdict:
    """Liveness transitions from the evidence the control plane had the chance to receive.

    Silence is measured up to the evidence horizon (`evidence_horizon`); while that lags,
    liveness is suspended and nothing moves (the last verdicts stand). When the breaker
    trips, no cluster goes down (stale ones may still be marked stale).
    """
    horizon, behind = evidence_horizon(now, progress, stale_after)
    if behind is not None:
        return Verdict({}, f"liveness suspended: {behind}")
    changes = liveness_changes(previous, last_heartbeats, horizon, stale_after, down_after)
    going_down = [c for c, (old, new) in changes.items() if new == "down" and old != "down"]
    # the breaker weighs every cluster silent now, not only those crossing into down in
    # this check: heartbeats have phases, so a fleet-wide silence crosses the line over two
    # or more checks, and counting only the first crossers let them go down (40 % of a
    # 10-cluster fleet) before the rest tripped it
    tracked = [
        c for c, beat in last_heartbeats.items() if beat is not None and previous.get(c) != "down"
    ]
    silent = [
        c
        for c in tracked
        if cluster_liveness(last_heartbeats[c], horizon, stale_after, down_after) != "healthy"
    ]
    breaker = breaker or Breaker()
    if going_down and breaker.trips(len(silent), len(tracked)):
        kept = {c: ch for c, ch in changes.items() if ch[1] != "down"}
        for cluster in going_down:  # at most stale while we suspect ourselves
            if previous.get(cluster) != "stale":
                kept[cluster] = (previous.get(cluster), "stale")
        why = (
            f"liveness suspended: {len(silent)} of {len(tracked)} clusters "
            f"({', '.join(sorted(silent))}) went silent at once; suspecting the control "
            "plane itself (circuit breaker)"
        )
        return Verdict(kept, why)
    return Verdict(changes)
