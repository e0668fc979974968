"""Cluster liveness in PostgreSQL: stale then down after missed heartbeats, with events.

Silence counts only up to what the bus process had processed (`bus_progress`, written by
`record_bus_progress`); a suspension of the check is recorded once as `LivenessSuspended`
and its end as `LivenessResumed`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from controlplane.db.models import BusProgress as ProgressRow
from controlplane.db.models import Cluster, Event
from controlplane.liveness import Breaker, BusProgress, Liveness, judge

TRACKED = ("healthy", "stale", "down")
SUSPENSION = ("LivenessSuspended", "LivenessResumed")


def record_bus_progress(
    session: Session,
    consumer: str,
    alive_at: datetime,
    caught_up_at: datetime | None,
    stream_last_seq: int,
    ack_floor: int,
    pending: int,
) -> None:
    """Upsert the bus process's progress. Several bus processes share one durable
    consumer: `caught_up_at` only moves forward, whoever writes."""
    values = {
        "consumer": consumer,
        "alive_at": alive_at,
        "caught_up_at": caught_up_at,
        "stream_last_seq": stream_last_seq,
        "ack_floor": ack_floor,
        "pending": pending,
    }
    stmt = insert(ProgressRow).values(**values)
    table = ProgressRow.__table__
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.consumer],
        set_={
            "alive_at": func.greatest(table.c.alive_at, stmt.excluded.alive_at),
            "caught_up_at": func.greatest(table.c.caught_up_at, stmt.excluded.caught_up_at),
            "stream_last_seq": stmt.excluded.stream_last_seq,
            "ack_floor": stmt.excluded.ack_floor,
            "pending": stmt.excluded.pending,
        },
    )
    session.execute(stmt)


def bus_progress(session: Session) -> BusProgress | None:
    """The most advanced of the bus processes' bookkeeping (None: none ever wrote any)."""
    rows = list(session.scalars(select(ProgressRow)))
    if not rows:
        return None
    best = max(rows, key=lambda r: (r.caught_up_at or r.alive_at, r.alive_at))
    return BusProgress(best.alive_at, best.caught_up_at, best.pending)


def update_liveness(
    session: Session,
    now: datetime,
    stale_after: timedelta,
    down_after: timedelta,
    breaker: Breaker | None = None,
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
    previous: dict[str, Liveness] = {c.name: c.state for c in clusters}  # type: ignore[misc]
    beats = {c.name: c.last_heartbeat_at for c in clusters}
    progress = bus_progress(session)
    verdict = judge(previous, beats, now, stale_after, down_after, progress, breaker)
    _note_suspension(session, verdict.suspended)
    went_down = []
    for cluster in clusters:
        if cluster.name not in verdict.changes:
            continue
        old, new = verdict.changes[cluster.name]
        cluster.state = new
        beat = cluster.last_heartbeat_at
        silence = (now - beat).total_seconds() if beat else None
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


def _note_suspension(session: Session, why: str | None) -> None:
    """One `LivenessSuspended` when the check starts suspecting itself, one
    `LivenessResumed` when it stops."""
    last = session.scalars(
        select(Event).where(Event.type.in_(SUSPENSION)).order_by(Event.time.desc()).limit(1)
    ).first()
    suspended = last is not None and last.type == "LivenessSuspended"
    if why is not None and not suspended:
        session.add(
            Event(
                type="LivenessSuspended",
                object_kind="ControlPlane",
                object_name="liveness",
                message=f"{why}; no cluster is declared down until heartbeats flow again",
                data={"reason": why},
            )
        )
    elif why is None and suspended:
        session.add(
            Event(
                type="LivenessResumed",
                object_kind="ControlPlane",
                object_name="liveness",
                message="liveness judged again: the bus process is caught up and heartbeats flow",
                data={},
            )
        )
