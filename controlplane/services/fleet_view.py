"""Read models for the dashboard: the fleet summarised for people, one query per table.

Each function reads what a page shows and nothing more: aggregates are computed in SQL
(GROUP BY) or over one pass of the rows, and lists take `offset`/`limit` so that a page
never loads the whole fleet's detail. Money is `Decimal`; GPUs are ints.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload, raiseload

from controlplane.db import models as m


@dataclass(frozen=True)
class PoolView:
    name: str
    provider: str
    region: str
    gpu_type: str
    purchase_type: str
    gpus: int
    """GPUs usable now (the pool's spec)."""
    held: int
    """GPUs we pay for there (`held_gpus`)."""
    allocated: int
    """GPUs the current placement gives replicas there."""
    price: Decimal
    quota: int | None
    committed: int | None
    interruptions_per_hour: Decimal | None
    term_end: datetime | None
    blocked: str | None

    @property
    def free(self) -> int:
        return max(self.held - self.allocated, 0)

    @property
    def cost_per_hour(self) -> Decimal:
        return self.price * self.held

    @property
    def utilisation(self) -> float | None:
        return self.allocated / self.held if self.held else None


def held_gpus(pool: m.Pool) -> int:
    """What we pay for: a reservation's commitment (or its size); otherwise the declared GPUs
    (`gpus`) plus the instances procurement holds there (bought beyond them)."""
    status = dict(pool.status or {})
    if pool.purchase_type == "reserved":
        return pool.committed_gpus or pool.gpus
    return int(status.get("held_gpus") or 0) + pool.gpus


def allocated_by_pool(session: Session, pool_ids: Iterable[str] | None = None) -> dict[str, int]:
    query = (
        select(m.Placement.pool_id, func.sum(m.Placement.replicas * m.Deployment.gpus_per_replica))
        .join(m.Deployment, m.Deployment.id == m.Placement.deployment_id)
        .group_by(m.Placement.pool_id)
    )
    if pool_ids is not None:
        query = query.where(m.Placement.pool_id.in_(list(pool_ids)))
    return {pool_id: int(total or 0) for pool_id, total in session.execute(query).all()}


def _pool_view(row: m.Pool, allocated: int) -> PoolView:
    return PoolView(
        name=row.name,
        provider=row.provider.name,
        region=row.region.name,
        gpu_type=row.gpu_type.name,
        purchase_type=row.purchase_type,
        gpus=row.gpus,
        held=held_gpus(row),
        allocated=allocated,
        price=row.price_per_gpu_hour,
        quota=row.quota_gpus,
        committed=row.committed_gpus,
        interruptions_per_hour=row.interruptions_per_hour,
        term_end=row.term_end,
        blocked=dict(row.status or {}).get("blocked"),
    )


def pools(session: Session, offset: int = 0, limit: int | None = None) -> list[PoolView]:
    query = select(m.Pool).order_by(m.Pool.name).offset(offset)
    if limit is not None:
        query = query.limit(limit)
    rows = list(session.scalars(query).unique())
    allocated = allocated_by_pool(session, [r.id for r in rows] if limit is not None else None)
    return [_pool_view(r, allocated.get(r.id, 0)) for r in rows]


def count(session: Session, row: type[Any]) -> int:
    return int(session.scalar(select(func.count()).select_from(row)) or 0)


@dataclass
class Totals:
    held: int = 0
    allocated: int = 0
    free: int = 0
    cost_per_hour: Decimal = Decimal(0)

    def add(self, pool: PoolView) -> None:
        self.held += pool.held
        self.allocated += pool.allocated
        self.free += pool.free
        self.cost_per_hour += pool.cost_per_hour


@dataclass
class Unplaced:
    deployment: str
    replicas: int
    constraint: str
    reason: str


@dataclass
class Overview:
    total: Totals
    by: dict[str, dict[str, Totals]]
    """dimension (provider, region, gpu_type, purchase_type) → value → totals"""
    reservations: list[PoolView]
    unplaced: list[Unplaced]
    clusters_by_state: dict[str, int]
    deployments: int
    replicas_by_state: dict[str, int] = field(default_factory=dict)


DIMENSIONS = ("provider", "region", "gpu_type", "purchase_type")


def overview(session: Session, unplaced_limit: int = 20) -> Overview:
    total = Totals()
    by: dict[str, dict[str, Totals]] = {d: defaultdict(Totals) for d in DIMENSIONS}
    reservations: list[PoolView] = []
    for pool in pools(session):
        total.add(pool)
        for d in DIMENSIONS:
            by[d][getattr(pool, d)].add(pool)
        if pool.purchase_type == "reserved":
            reservations.append(pool)
    unplaced: list[Unplaced] = []
    statuses = session.execute(
        select(m.Deployment.name, m.Deployment.status).order_by(m.Deployment.name)
    ).all()
    for name, status in statuses:
        placement = dict(status or {}).get("placement") or {}
        for u in placement.get("unplaced") or []:
            if len(unplaced) < unplaced_limit:
                unplaced.append(Unplaced(name, u["replicas"], u["constraint"], u["reason"]))
    clusters = dict(
        session.execute(select(m.Cluster.state, func.count()).group_by(m.Cluster.state)).all()
    )
    replicas = dict(
        session.execute(select(m.Replica.state, func.count()).group_by(m.Replica.state)).all()
    )
    return Overview(
        total=total,
        by={d: dict(sorted(v.items())) for d, v in by.items()},
        reservations=sorted(reservations, key=lambda p: p.name)[:20],
        unplaced=unplaced,
        clusters_by_state={str(k): int(v) for k, v in clusters.items()},
        deployments=len(statuses),
        replicas_by_state={str(k): int(v) for k, v in replicas.items()},
    )


@dataclass(frozen=True)
class ClusterView:
    name: str
    region: str
    latitude: float
    longitude: float
    state: str
    cordoned: bool
    agent_version: str | None
    last_heartbeat_at: datetime | None
    desired_generation: int
    observed_generation: int
    endpoint: str | None
    gpus: int
    replicas: dict[str, int]
    instances: dict[str, int]

    def heartbeat_age_s(self, now: datetime) -> float | None:
        if self.last_heartbeat_at is None:
            return None
        return max((now - self.last_heartbeat_at).total_seconds(), 0.0)


def _grouped(
    session: Session, column: Any, state: Any, ids: list[str]
) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    rows = session.execute(
        select(column, state, func.count()).where(column.in_(ids)).group_by(column, state)
    ).all()
    for owner, value, n in rows:
        out[owner][str(value)] = int(n)
    return out


def clusters(session: Session, offset: int = 0, limit: int | None = None) -> list[ClusterView]:
    query = (
        select(m.Cluster)
        .options(raiseload(m.Cluster.pools), joinedload(m.Cluster.region))
        .order_by(m.Cluster.name)
        .offset(offset)
    )
    if limit is not None:
        query = query.limit(limit)
    rows = list(session.scalars(query).unique())
    ids = [r.id for r in rows]
    replicas = _grouped(session, m.Replica.cluster_id, m.Replica.state, ids)
    instances = _grouped(session, m.Instance.cluster_id, m.Instance.state, ids)
    gpus = dict(
        session.execute(
            select(m.cluster_pools.c.cluster_id, func.sum(m.Pool.gpus))
            .join(m.Pool, m.Pool.id == m.cluster_pools.c.pool_id)
            .where(m.cluster_pools.c.cluster_id.in_(ids))
            .group_by(m.cluster_pools.c.cluster_id)
        ).all()
    )
    return [
        ClusterView(
            name=r.name,
            region=r.region.name,
            latitude=r.region.latitude,
            longitude=r.region.longitude,
            state=r.state,
            cordoned=bool(dict(r.status or {}).get("cordoned")),
            agent_version=r.agent_version,
            last_heartbeat_at=r.last_heartbeat_at,
            desired_generation=r.desired_generation,
            observed_generation=r.observed_generation,
            endpoint=r.endpoint,
            gpus=int(gpus.get(r.id) or 0),
            replicas=replicas.get(r.id, {}),
            instances=instances.get(r.id, {}),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class DeploymentRow:
    name: str
    model_id: str
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    revision: int
    wanted: int
    placed: int
    cost_per_hour: str
    desired: dict[str, int]
    """cluster → replicas placement gives it"""
    ready: dict[str, int]
    """cluster → replicas the plane reports ready"""


def deployments(session: Session, offset: int = 0, limit: int = 50) -> list[DeploymentRow]:
    rows = list(
        session.scalars(
            select(m.Deployment)
            .options(raiseload(m.Deployment.revisions))
            .order_by(m.Deployment.name)
            .offset(offset)
            .limit(limit)
        )
    )
    ids = [r.id for r in rows]
    desired: dict[str, dict[str, int]] = defaultdict(dict)
    for dep, cluster, n in session.execute(
        select(m.Placement.deployment_id, m.Cluster.name, func.sum(m.Placement.replicas))
        .join(m.Cluster, m.Cluster.id == m.Placement.cluster_id)
        .where(m.Placement.deployment_id.in_(ids))
        .group_by(m.Placement.deployment_id, m.Cluster.name)
    ).all():
        desired[dep][cluster] = int(n or 0)
    ready: dict[str, dict[str, int]] = defaultdict(dict)
    for dep, cluster, n in session.execute(
        select(m.Replica.deployment_id, m.Cluster.name, func.count())
        .join(m.Cluster, m.Cluster.id == m.Replica.cluster_id)
        .where(m.Replica.deployment_id.in_(ids), m.Replica.state == "ready")
        .group_by(m.Replica.deployment_id, m.Cluster.name)
    ).all():
        ready[dep][cluster] = int(n)
    out = []
    for r in rows:
        placement = dict(r.status or {}).get("placement") or {}
        scaling = dict(r.autoscaling or {})
        out.append(
            DeploymentRow(
                name=r.name,
                model_id=r.model_id,
                gpus_per_replica=r.gpus_per_replica,
                min_replicas=int(scaling.get("min_replicas") or 0),
                max_replicas=int(scaling.get("max_replicas") or 0),
                revision=r.revision,
                wanted=int(placement.get("wanted_replicas") or 0),
                placed=int(placement.get("placed_replicas") or 0),
                cost_per_hour=str(placement.get("cost_per_hour") or "0"),
                desired=desired.get(r.id, {}),
                ready=ready.get(r.id, {}),
            )
        )
    return out


def router_urls(session: Session, configured: dict[str, str]) -> dict[str, str]:
    """Cluster name → its router's base URL: the cluster's `endpoint`, else `configured`."""
    rows = session.execute(select(m.Cluster.name, m.Cluster.endpoint).order_by(m.Cluster.name))
    out: dict[str, str] = {}
    for name, endpoint in rows.all():
        url = endpoint or configured.get(name)
        if url:
            out[name] = url.rstrip("/").removesuffix("/v1")
    return out


@dataclass(frozen=True)
class ReplicaEndpoint:
    cluster: str
    deployment: str
    replica: str
    url: str


def replica_endpoints(session: Session, limit: int = 10_000) -> list[ReplicaEndpoint]:
    """Every replica the planes report with an endpoint (its engine: vLLM's `/metrics`),
    except failed ones, by cluster and name; at most ``limit``."""
    rows = session.execute(
        select(m.Cluster.name, m.Deployment.name, m.Replica.name, m.Replica.endpoint)
        .join(m.Cluster, m.Replica.cluster_id == m.Cluster.id)
        .join(m.Deployment, m.Replica.deployment_id == m.Deployment.id)
        .where(m.Replica.endpoint.is_not(None), m.Replica.state != "failed")
        .order_by(m.Cluster.name, m.Replica.name)
        .limit(limit)
    )
    return [ReplicaEndpoint(c, d, r, str(url)) for c, d, r, url in rows.all()]


@dataclass(frozen=True)
class ClusterName:
    id: str
    name: str


def cluster_names(session: Session) -> list[ClusterName]:
    rows = session.execute(select(m.Cluster.id, m.Cluster.name).order_by(m.Cluster.name)).all()
    return [ClusterName(i, n) for i, n in rows]


@dataclass(frozen=True)
class Plan:
    total_cost_per_hour: Decimal
    deployments: int
    page: dict[str, dict[str, Any]]
    """deployment name → its stored placement status (wanted, placed, where, why not more)"""


def plan(session: Session, offset: int = 0, limit: int = 50) -> Plan:
    """The stored plan as each deployment's last placement status: no re-plan, no world."""
    rows = session.execute(
        select(m.Deployment.name, m.Deployment.status).order_by(m.Deployment.name)
    ).all()
    placed = [(name, dict(status or {}).get("placement") or {}) for name, status in rows]
    total = sum((Decimal(str(p.get("cost_per_hour") or 0)) for _, p in placed), Decimal(0))
    return Plan(total, len(placed), dict(placed[offset : offset + limit]))


def region_locations(session: Session, names: Iterable[str]) -> dict[str, tuple[float, float]]:
    """Region name → (latitude, longitude), for the regions named that the fleet knows."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = session.execute(
        select(m.Region.name, m.Region.latitude, m.Region.longitude).where(
            m.Region.name.in_(wanted)
        )
    )
    return {name: (lat, lon) for name, lat, lon in rows.all()}
