"""The gateways' routing table against PostgreSQL: load its inputs, number it.

The content is `controlplane.routes.build_routes` of the deployments, their placements, the
clusters and the regions. Its version ``(epoch, generation)`` lives in the `routing_state`
row, beside the digest of the content it numbers: the generation moves only when the
content does (level-based, like a cluster's desired generation), and never goes back across
a restart of the bus process or a wiped bucket. A bucket entry the control plane never
issued (ahead of its numbering, or the same version with other content: forged, or from
before a database restore) starts a new epoch above it (`claim_stored`), as
`controlplane.services.epochs` does for desired state.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from controlplane.contracts import RoutingTable
from controlplane.db import models as m
from controlplane.db.columns import deployment_failover, deployment_placement
from controlplane.routes import Plane, RouteBook, Served, Site, build_routes
from controlplane.services.epochs import MAX_EPOCH

log = logging.getLogger("gpufleet.routes")

STATE_ID = 1


def load_book(session: Session) -> RouteBook:
    """The routing table's content as the database has it now."""
    regions = session.scalars(select(m.Region).order_by(m.Region.name)).unique().all()
    clusters = session.scalars(select(m.Cluster).order_by(m.Cluster.name)).unique().all()
    names = {c.id: c.name for c in clusters}
    replicas: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for dep_id, cluster_id, count in session.execute(
        select(m.Placement.deployment_id, m.Placement.cluster_id, m.Placement.replicas)
    ):
        replicas[dep_id][names[cluster_id]] += count
    leaving: dict[str, dict[str, int]] = defaultdict(dict)
    for dep_id, cluster_id, count in session.execute(_leaving()):
        leaving[dep_id][names[cluster_id]] = count
    deployments = session.scalars(select(m.Deployment).order_by(m.Deployment.name)).all()
    return build_routes(
        served=[
            Served(
                name=d.name,
                placement=deployment_placement(d),
                failover=deployment_failover(d),
                replicas=dict(replicas.get(d.id, {})),
                leaving=leaving.get(d.id, {}),
            )
            for d in deployments
        ],
        planes=[Plane(c.name, c.region.name, c.endpoint) for c in clusters],
        sites=[
            Site(r.name, r.jurisdiction, r.latitude, r.longitude, r.provider.name) for r in regions
        ],
    )


def _leaving() -> Select[str, str, int]:
    """(deployment id, cluster id, count) of ready replicas on draining instances: they keep
    serving until their replacements elsewhere are ready (`services.desired`'s holds)."""
    return (
        select(m.Replica.deployment_id, m.Replica.cluster_id, func.count().label("replicas"))
        .join(m.Instance, m.Instance.id == m.Replica.instance_id)
        .join(m.Cluster, m.Cluster.id == m.Replica.cluster_id)
        .where(
            m.Replica.state == "ready",
            m.Instance.state == "draining",
            m.Cluster.state != "down",  # a dead plane's last report serves nobody
        )
        .group_by(m.Replica.deployment_id, m.Replica.cluster_id)
    )


def fingerprint(session: Session) -> tuple[Any, ...]:
    """Moves whenever anything the table is built from may have changed: a spec change
    (generation), a row created or deleted (count, newest creation), a placement change (it
    bumps the desired generation of every cluster it touches), the number of replicas
    serving from draining instances. One cheap query; heartbeats alone do not move it."""
    columns: list[Any] = [func.sum(m.Cluster.desired_generation), func.sum(m.Cluster.desired_epoch)]
    for row in (m.Deployment, m.Cluster, m.Region, m.Provider):
        columns += [func.count(row.id), func.sum(row.generation), func.max(row.created_at)]
    parts = [select(c).scalar_subquery() for c in columns]
    leaving = _leaving().subquery()
    parts.append(select(func.sum(leaving.c.replicas)).scalar_subquery())
    return tuple(session.execute(select(*parts)).one())


@dataclass(frozen=True)
class Numbered:
    table: RoutingTable
    book: RouteBook
    moved: bool
    """True when this call gave the content a new generation."""


def _state(session: Session) -> m.RoutingState:
    session.execute(insert(m.RoutingState).values(id=STATE_ID).on_conflict_do_nothing())
    return session.scalars(
        select(m.RoutingState).where(m.RoutingState.id == STATE_ID).with_for_update()
    ).one()


def number_table(session: Session, now: datetime) -> Numbered:
    """The routing table now, at a new generation if its content changed since the last
    one was numbered (under the state row's lock: two bus processes number it once). The
    lock comes first: a content read before it could be older than what the other process
    numbered meanwhile, and would have been numbered above it."""
    state = _state(session)
    book = load_book(session)
    digest = book.digest()
    moved = state.digest != digest or state.generation == 0
    if moved:
        state.generation += 1
        state.digest = digest
    table = RoutingTable(
        generation=state.generation,
        epoch=state.epoch,
        time=now,
        deployments=list(book.deployments),
        regions=list(book.regions),
    )
    return Numbered(table, book, moved)


def issued_version(session: Session) -> tuple[int, int, str]:
    """``(epoch, generation, digest)`` the control plane numbered last."""
    state = session.get(m.RoutingState, STATE_ID)
    return (0, 0, "") if state is None else (state.epoch, state.generation, state.digest)


def claim_stored(session: Session, stored: RoutingTable) -> bool:
    """The bucket holds ``stored`` where we tried to publish ours: start a new epoch above
    it (True) if the control plane never issued it — a version ahead of its numbering, or
    its own version with other content. False if it did (another bus process is ahead: the
    next build catches up)."""
    state = _state(session)
    ours = (state.epoch, state.generation)
    content = RouteBook(tuple(stored.deployments), tuple(stored.regions)).digest()
    if stored.version < ours or (stored.version == ours and content == state.digest):
        return False
    if stored.epoch >= MAX_EPOCH:
        log.error(
            "the routing table in the bucket holds epoch %d, beyond what the control plane can "
            "out-number; delete the key (nats kv del gpufleet_v1_routes table) and restart "
            "the gateways with their state removed",
            stored.epoch,
        )
        return False
    session.execute(
        update(m.RoutingState)
        .where(m.RoutingState.id == STATE_ID)
        .values(epoch=max(state.epoch, stored.epoch) + 1, generation=state.generation + 1)
        .execution_options(synchronize_session=False)
    )
    log.warning(
        "the routing table in the bucket is generation %d of epoch %d, which the control plane "
        "never issued (its own: %d of epoch %d); starting epoch %d",
        stored.generation,
        stored.epoch,
        state.generation,
        state.epoch,
        max(state.epoch, stored.epoch) + 1,
    )
    session.add(
        m.Event(
            type="RoutesEpochStarted",
            object_kind="RoutingTable",
            object_name="table",
            message=f"routing table: the bucket held generation {stored.generation} of epoch "
            f"{stored.epoch}, never issued; republished in epoch "
            f"{max(state.epoch, stored.epoch) + 1}",
            data={
                "seen": {"epoch": stored.epoch, "generation": stored.generation},
                "before": {"epoch": ours[0], "generation": ours[1]},
            },
        )
    )
    return True
