"""Desired state per cluster, built from PostgreSQL (the source of truth) for publication.

A cluster's `desired_generation` is bumped whenever what it should run changes; the bus
process publishes a full snapshot at that generation (newest wins on the agent side).
A removal (a deployment, pool or cluster deleted, a cluster leaving a pool, a pool emptied)
bumps the clusters it affects in its own transaction, computed before the rows go: a later
re-plan cannot see what is no longer there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    DesiredState,
    InstanceDesired,
    PoolQuota,
    ReplicaQuota,
    RevisionSpec,
    ScheduleWindow,
)
from controlplane.db.columns import deployment_autoscaling, deployment_failover
from controlplane.db.models import (
    AuditEntry,
    Cluster,
    Deployment,
    Instance,
    Placement,
    Pool,
    Replica,
    cluster_pools,
)
from controlplane.procurement.core import ACTIVE
from controlplane.services import lanes
from controlplane.services import shadows as shadow_lanes
from controlplane.specs import AutoscalingSpec

PURCHASE_PREFERENCE = {"reserved": 0, "spot": 1, "on_demand": 2}
"""Order of a deployment's pools in `pool_quotas`: a plane that scales up inside its quota
fills paid-for capacity first."""
RETIRED_WITHIN = timedelta(hours=1)
"""How long a deleted deployment is listed in every snapshot's `retired`."""


def bump_desired(session: Session, cluster_ids: Iterable[str]) -> None:
    ids = sorted(set(cluster_ids))
    if ids:
        session.execute(
            update(Cluster)
            .where(Cluster.id.in_(ids))
            .values(desired_generation=Cluster.desired_generation + 1)
        )


# what a removal changes -------------------------------------------------------------------


def clusters_serving(session: Session, deployment_ids: Iterable[str]) -> set[str]:
    """Clusters that place or run any of these deployments (a removal elsewhere changes
    their routing share, or what they run)."""
    ids = sorted(set(deployment_ids))
    if not ids:
        return set()
    placed = select(Placement.cluster_id).where(Placement.deployment_id.in_(ids))
    running = select(Replica.cluster_id).where(Replica.deployment_id.in_(ids))
    return set(session.scalars(placed.union(running)))


def removing_deployment(session: Session, deployment: Deployment) -> set[str]:
    """Clusters whose desired state changes when `deployment` goes: where it is placed or
    still has replicas (on a draining instance too)."""
    return clusters_serving(session, [deployment.id])


def removing_cluster(session: Session, cluster: Cluster) -> set[str]:
    """Other clusters whose desired state changes when `cluster` goes: those sharing a
    deployment with it (their routing share grows). The cluster itself gets no more
    snapshots: the bus process retires its key (docs/bus.md)."""
    here = session.scalars(
        select(Placement.deployment_id).where(Placement.cluster_id == cluster.id)
    )
    return clusters_serving(session, here) - {cluster.id}


def removing_pool(session: Session, pool: Pool) -> set[str]:
    """Clusters whose desired state changes when `pool` goes: those placing on it, drawing
    on it, or holding instances in it."""
    placed = select(Placement.deployment_id).where(Placement.pool_id == pool.id)
    linked = select(cluster_pools.c.cluster_id).where(cluster_pools.c.pool_id == pool.id)
    holding = select(Instance.cluster_id).where(
        Instance.pool_id == pool.id, Instance.cluster_id.is_not(None)
    )
    return (
        clusters_serving(session, session.scalars(placed))
        | set(session.scalars(linked))
        | {c for c in session.scalars(holding) if c is not None}
    )


def withdraw_placements(
    session: Session, cluster_id: str | None = None, pool_ids: Iterable[str] = ()
) -> None:
    """Placements that can no longer stand (the cluster left these pools, or they hold no
    GPUs): removed now, and the clusters they affect bumped; the re-plan that follows
    places their replicas elsewhere."""
    ids = sorted(set(pool_ids))
    if not ids:
        return
    where: list[ColumnElement[bool]] = [Placement.pool_id.in_(ids)]
    if cluster_id is not None:
        where.append(Placement.cluster_id == cluster_id)
    rows = session.execute(select(Placement.deployment_id, Placement.cluster_id).where(*where))
    gone = rows.all()
    if not gone:
        return
    affected = clusters_serving(session, {d for d, _ in gone}) | {c for _, c in gone}
    session.execute(delete(Placement).where(*where))
    bump_desired(session, affected)


def pool_is_empty(session: Session, pool: Pool) -> bool:
    """No GPUs declared and none held by procurement: nothing can run on it."""
    if pool.gpus != 0:
        return False  # no query: a pool that declares GPUs is never empty
    held = session.scalar(
        select(func.coalesce(func.sum(Instance.gpus), 0)).where(
            Instance.pool_id == pool.id, Instance.state.in_(ACTIVE)
        )
    )
    return not held


def desired_state(session: Session, cluster: Cluster) -> DesiredState:
    rows = sorted(
        session.execute(
            select(Placement, Deployment, Pool)
            .join(Deployment, Deployment.id == Placement.deployment_id)
            .join(Pool, Pool.id == Placement.pool_id)
            .where(Placement.cluster_id == cluster.id)
        ).all(),
        key=lambda row: (row[1].name, _preference(row[2])),
    )
    by_deployment: dict[str, list[tuple[Placement, str]]] = defaultdict(list)
    deployments: dict[str, Deployment] = {}
    for placement, deployment, pool in rows:
        by_deployment[deployment.name].append((placement, pool.name))
        deployments[deployment.name] = deployment
    # a deployment placed here no more may still have replicas on a draining instance here,
    # serving until their replacements elsewhere are ready: it stays, with a quota of 0
    for deployment in _leaving_here(session, cluster):
        deployments.setdefault(deployment.name, deployment)
    total_weight = _total_replicas(session, deployments.values())
    holds = _holds(session, cluster, deployments.values(), total_weight)
    entries = [
        _deployment_desired(
            deployment,
            by_deployment.get(name, []),
            total_weight.get(name, 0),
            standby=deployment_failover(deployment).standby == cluster.name,
        ).model_copy(update={"hold_leaving": holds.get(name, 0)})
        for name, deployment in sorted(deployments.items())
        if name in by_deployment or holds.get(name, 0) > 0
    ]
    here = {name: sum(p.replicas for p, _ in placed) for name, placed in by_deployment.items()}
    entries = shadow_lanes.with_shadows(entries, here, deployments)  # after each, its shadow
    gone = shadow_lanes.retired_shadows(session, RETIRED_WITHIN)
    return DesiredState(
        cluster=cluster.name,
        generation=cluster.desired_generation,
        epoch=cluster.desired_epoch,
        retired=sorted(
            retired_deployments(session) + lanes.retired_lanes(session, RETIRED_WITHIN) + gone
        ),
        deployments=lanes.with_lanes(
            entries, here, lanes.running_canaries(session, deployments.values())
        ),
        instances=_instances(session, cluster),
    )


RETIRED_MAX = 256
"""The most deleted deployments a snapshot names (the latest): every cluster's snapshot
carries them, and a churn of thousands pushed every snapshot past NATS' payload limit.
One left out is only kept through its disappearance grace by a plane still serving it."""


def retired_deployments(
    session: Session, within: timedelta = RETIRED_WITHIN, most: int = RETIRED_MAX
) -> list[str]:
    """Deployments a user deleted within ``within`` (the audit log) that do not exist again,
    the ``most`` latest: a plane drains them at once instead of keeping them through its
    disappearance grace."""
    latest = (
        select(AuditEntry.resource_name)
        .where(
            AuditEntry.action == "delete",
            AuditEntry.resource_kind == "Deployment",
            AuditEntry.resource_name.is_not(None),
            AuditEntry.time >= func.now() - within,
            AuditEntry.resource_name.not_in(select(Deployment.name)),
        )
        .group_by(AuditEntry.resource_name)
        .order_by(func.max(AuditEntry.time).desc())
        .limit(most)
    )
    return sorted(name for name in session.scalars(latest).all() if name is not None)


def _leaving_here(session: Session, cluster: Cluster) -> list[Deployment]:
    """Deployments with ready replicas on this cluster's draining instances."""
    return list(
        session.scalars(
            select(Deployment)
            .join(Replica, Replica.deployment_id == Deployment.id)
            .join(Instance, Instance.id == Replica.instance_id)
            .where(
                Replica.cluster_id == cluster.id,
                Replica.state == "ready",
                Instance.state == "draining",
            )
            .distinct()
        )
    )


def split_holds(deficit: int, leaving: dict[str, int]) -> dict[str, int]:
    """How many replicas on draining instances each cluster keeps serving: the deployment's
    deficit of ready replicas elsewhere, given out in cluster-name order, never more than a
    cluster has leaving."""
    holds: dict[str, int] = {}
    left = max(0, deficit)
    for cluster in sorted(leaving):
        holds[cluster] = min(leaving[cluster], left)
        left -= holds[cluster]
    return holds


def _holds(
    session: Session, cluster: Cluster, deployments: Iterable[Deployment], placed: dict[str, int]
) -> dict[str, int]:
    """Per deployment (placed here, or leaving here): `hold_leaving` for this cluster. A
    replica on a draining instance (spot notice, cordon) keeps serving while the deployment
    has fewer ready replicas elsewhere than placed — its replacement may be starting on
    another cluster, which this cluster's agent cannot see. `release_holds` re-publishes as
    they get ready."""
    ids = {d.id: d.name for d in deployments}
    if not ids:
        return {}
    rows = session.execute(
        select(Replica.deployment_id, Cluster.name, Instance.state)
        .join(Cluster, Cluster.id == Replica.cluster_id)
        .outerjoin(Instance, Instance.id == Replica.instance_id)
        .where(
            Replica.deployment_id.in_(list(ids)),
            Replica.state == "ready",
            Cluster.state != "down",  # a dead plane's last report serves nobody
        )
    ).all()
    leaving: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    staying: dict[str, int] = defaultdict(int)
    for dep_id, cluster_name, instance_state in rows:
        if instance_state == "draining":
            leaving[ids[dep_id]][cluster_name] += 1
        else:
            staying[ids[dep_id]] += 1
    return {
        name: split_holds(placed.get(name, 0) - staying[name], leaving[name]).get(cluster.name, 0)
        for name in leaving
    }


def release_holds(session: Session, deployment_ids: Iterable[str]) -> None:
    """Replicas of these deployments got ready: clusters holding replicas on draining
    instances get a new desired generation (their holds shrink)."""
    ids = sorted(set(deployment_ids))
    if not ids:
        return
    clusters = session.scalars(
        select(Replica.cluster_id)
        .join(Instance, Instance.id == Replica.instance_id)
        .where(Replica.deployment_id.in_(ids), Instance.state == "draining")
        .distinct()
    )
    bump_desired(session, clusters)


def _preference(pool: Pool) -> tuple[int, float, str]:
    return (
        PURCHASE_PREFERENCE.get(pool.purchase_type, 3),
        float(pool.price_per_gpu_hour),
        pool.name,
    )


def _instances(session: Session, cluster: Cluster) -> list[InstanceDesired]:
    """The machines held for this cluster that its replicas may run on or must leave."""
    rows = session.execute(
        select(Instance, Pool.name)
        .join(Pool, Pool.id == Instance.pool_id)
        .where(
            Instance.cluster_id == cluster.id,
            Instance.state.in_(("running", "draining")),
            Instance.provider_instance_id.is_not(None),
        )
        .order_by(Pool.name, Instance.created_at, Instance.provider_instance_id)
    ).all()
    return [
        InstanceDesired(
            id=inst.provider_instance_id or "",
            pool=pool,
            gpus=inst.gpus,
            draining=inst.state == "draining",
            drain_deadline=inst.drain_deadline if inst.state == "draining" else None,
        )
        for inst, pool in rows
    ]


def _total_replicas(session: Session, deployments: Iterable[Deployment]) -> dict[str, int]:
    ids = {d.id: d.name for d in deployments}
    if not ids:
        return {}
    totals: dict[str, int] = defaultdict(int)
    for dep_id, replicas in session.execute(
        select(Placement.deployment_id, Placement.replicas).where(
            Placement.deployment_id.in_(list(ids))
        )
    ):
        totals[ids[dep_id]] += replicas
    return totals


def _deployment_desired(
    deployment: Deployment,
    entries: list[tuple[Placement, str]],
    global_replicas: int,
    standby: bool = False,
) -> DeploymentDesired:
    """``standby``: this cluster is the deployment's active_passive standby; its placement
    holds min = max = standby_replicas, and it neither scales to zero nor follows the
    schedule (it is kept warm at exactly that size)."""
    here = sum(p.replicas for p, _ in entries)
    share = here / global_replicas if global_replicas else 1.0
    auto = deployment_autoscaling(deployment)
    return DeploymentDesired(
        name=deployment.name,
        spec=RevisionSpec(
            model_id=deployment.model_id,
            revision=f"{deployment.revision}",
            engine_image=deployment.engine_image,
            engine_args=list(deployment.engine_args),
            gpu_types=list(deployment.gpu_types),
            gpus_per_replica=deployment.gpus_per_replica,
        ),
        quota=ReplicaQuota(
            min=sum(p.min_replicas for p, _ in entries),
            max=max(here, sum(p.max_replicas for p, _ in entries)),
        ),
        pools=sorted({pool for _, pool in entries}),
        pool_quotas=[
            PoolQuota(pool=pool, min=p.min_replicas, max=max(p.replicas, p.max_replicas))
            for p, pool in entries
        ],
        routing_weight=share,
        priority=deployment.priority,
        autoscaling=AutoscalingPolicy(
            window_seconds=auto.window_seconds,
            scale_down_delay_seconds=auto.scale_down_delay_seconds,
            target_concurrency=auto.target_concurrency,
            scale_to_zero_idle_seconds=(
                auto.scale_to_zero_idle_seconds if auto.min_replicas == 0 and not standby else None
            ),
            schedule=[] if standby else _schedule(auto, share),
        ),
    )


def _schedule(auto: AutoscalingSpec, share: float) -> list[ScheduleWindow]:
    """The deployment's schedule, each window's min split by this cluster's share of it."""
    return [
        ScheduleWindow(
            days=list(w.days),
            start=w.start,
            end=w.end,
            timezone=w.timezone,
            min_replicas=math.ceil(w.min_replicas * share - 1e-9),
        )
        for w in auto.schedule
    ]
