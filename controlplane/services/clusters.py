"""Cluster liveness in PostgreSQL: stale then down after missed heartbeats, with events."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.db.models import Cluster, Event
from controlplane.liveness import liveness_changes

TRACKED = ("healthy", "stale", "down")


def update_liveness(
    session: Session, now: datetime, stale_after: timedelta, down_after: timedelta
) -> list[str]:
    """Move clusters between healthy/stale/down; returns the names that went down.

    Clusters that never sent a heartbeat stay `pending` (no agent yet), cordoned ones keep
    their state: only the three liveness states are moved here.
    """
    clusters = list(
        session.scalars(
            select(Cluster)
            .where(Cluster.state.in_(TRACKED))
            .with_for_update(of=Cluster, skip_locked=True)
        )
    )
    previous = {c.name: c.state for c in clusters}
    beats = {c.name: c.last_heartbeat_at for c in clusters}
    changes = liveness_changes(previous, beats, now, stale_after, down_after)  # type: ignore[arg-type]
    went_down = []
    for cluster in clusters:
        if cluster.name not in changes:
            continue
        old, new = changes[cluster.name]
        cluster.state = new
        silence = (
            (now - cluster.last_heartbeat_at).total_seconds() if cluster.last_heartbeat_at else None
        )
        session.add(
            Event(
                type=f"Cluster{new.capitalize()}",
                object_kind="Cluster",
                object_id=cluster.id,
                object_name=cluster.name,
                message=f"cluster {cluster.name} is {new} (was {old}); "
                + (
                    f"last heartbeat {silence:.0f} s ago" if silence is not None else "no heartbeat"
                ),
                data={"from": old, "to": new},
            )
        )
        if new == "down":
            went_down.append(cluster.name)
    return went_down
