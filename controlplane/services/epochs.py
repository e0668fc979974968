"""Generation numbering per cluster: the control plane owns it, as ``(epoch, generation)``.

A plane applies a snapshot only if its ``(epoch, generation)`` is above the one it holds. A
snapshot the control plane never issued — forged, corrupted, or from before a database
restore — can carry a generation far above the control plane's own (10^12) and would
otherwise wedge the plane: every later snapshot looks older. When the control plane sees
such a version (in the KV entry it is about to overwrite, or acknowledged by an agent), it
starts a new epoch above it and bumps the generation, so the bus process republishes and the
plane takes the new epoch whatever its generation. Runs in the caller's transaction.
"""

from __future__ import annotations

import logging

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from controlplane.db.models import Cluster, Event

log = logging.getLogger("gpufleet.epochs")

MAX_EPOCH = 2**62
"""Epochs live in a BIGINT column; a forged epoch beyond this cannot be out-numbered (the
plane's state directory must then be cleared by hand: see docs/bus.md)."""


def issued(cluster: Cluster, epoch: int, generation: int) -> bool:
    """True if ``(epoch, generation)`` is not ahead of the cluster's own numbering."""
    return (epoch, generation) <= (cluster.desired_epoch, cluster.desired_generation)


def start_epoch(session: Session, cluster: Cluster, seen: tuple[int, int], where: str) -> bool:
    """Move ``cluster`` to a new epoch above ``seen`` (a version it never issued, found in
    ``where``) and bump its generation, so that its snapshot is republished. False (and an
    error logged) when ``seen``'s epoch cannot be out-numbered."""
    if seen[0] >= MAX_EPOCH:
        log.error(
            "cluster %s: %s holds epoch %d, beyond what the control plane can out-number; "
            "stop its agent, remove its state directory's desired-state.* files and restart it",
            cluster.name,
            where,
            seen[0],
        )
        return False
    old = (cluster.desired_epoch, cluster.desired_generation)
    # in SQL, not from the loaded row: a concurrent bump of the generation is never lost,
    # and the generation always moves, so the bus process republishes
    epoch, generation = session.execute(
        update(Cluster)
        .where(Cluster.id == cluster.id)
        .values(
            desired_epoch=func.greatest(Cluster.desired_epoch, seen[0]) + 1,
            desired_generation=Cluster.desired_generation + 1,
            observed_generation=0,
        )
        .returning(Cluster.desired_epoch, Cluster.desired_generation)
        .execution_options(synchronize_session=False)
    ).one()
    for key, value in (("desired_epoch", epoch), ("desired_generation", generation),
                       ("observed_generation", 0)):  # fmt: skip
        set_committed_value(cluster, key, value)
    message = (
        f"cluster {cluster.name}: {where} holds generation {seen[1]} of epoch {seen[0]}, which "
        f"the control plane never issued (its own: {old[1]} of epoch {old[0]}); desired state "
        f"republished as generation {cluster.desired_generation} of epoch {cluster.desired_epoch}"
    )
    log.warning("%s", message)
    session.add(
        Event(
            type="DesiredEpochStarted",
            object_kind="Cluster",
            object_id=cluster.id,
            object_name=cluster.name,
            message=message,
            data={
                "seen": {"epoch": seen[0], "generation": seen[1]},
                "before": {"epoch": old[0], "generation": old[1]},
                "epoch": cluster.desired_epoch,
                "generation": cluster.desired_generation,
                "where": where,
            },
        )
    )
    return True


def note_applied(session: Session, cluster: Cluster, epoch: int, generation: int) -> bool:
    """An agent reports it holds ``(epoch, generation)`` (acknowledgement or heartbeat):
    keep ``observed_generation`` (of the current epoch only, never above what was issued),
    or start a new epoch when it holds a version never issued. True if it started one."""
    if not issued(cluster, epoch, generation):
        return start_epoch(session, cluster, (epoch, generation), "its agent")
    if epoch == cluster.desired_epoch:
        cluster.observed_generation = max(cluster.observed_generation, generation)
    return False


def claim_stored(session: Session, cluster_name: str, epoch: int, generation: int) -> bool:
    """The KV entry of ``cluster_name`` holds ``(epoch, generation)`` above the snapshot the
    bus process tried to publish: start a new epoch if that version is ahead of the
    cluster's numbering (re-read under a row lock: another process may have started one, or
    numbered past it, meanwhile). True if it started one."""
    cluster = session.scalars(
        select(Cluster).where(Cluster.name == cluster_name).with_for_update(of=Cluster)
    ).first()
    if cluster is None or issued(cluster, epoch, generation):
        return False
    return start_epoch(session, cluster, (epoch, generation), "the desired-state KV entry")
