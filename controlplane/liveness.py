"""Cluster liveness from heartbeat times: pure functions, the clock is passed in."""

from __future__ import annotations

from collections.abc import Mapping
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
