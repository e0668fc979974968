"""Placement against PostgreSQL: load the engine's input, run it, write the result.

`load_world` maps rows to the pure engine's dataclasses; `apply_result` writes placements,
per-deployment status (reasons, cost) and an event in the caller's transaction, and bumps
the desired generation of every cluster whose share changed. What-if previews
(`services.what_if`) run the same engine on a modified input and write nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from controlplane import placement as engine
from controlplane.db import models as m
from controlplane.db.columns import (
    cluster_status,
    deployment_autoscaling,
    deployment_placement,
    deployment_status,
    pool_status,
    set_status,
)
from controlplane.procurement.core import ACTIVE
from controlplane.procurement.store import blocked_reason, plan_procurement
from controlplane.services import spend
from controlplane.services.capacity import reported_capacity, running_share, usable_gpus
from controlplane.services.desired import bump_desired
from controlplane.services.lanes import running_canaries
from controlplane.services.reservations import Reserved, per_pool, reservations, reserve
from controlplane.services.shadows import shadow_of
from controlplane.services.standby import (
    Standby,
    engine_current,
    fold_standbys,
    is_standby,
    standbys_of,
    with_standbys,
)
from controlplane.spend import SpendLimits

LOCK_KEY = 0x6770_666C  # "gpfl": one re-plan at a time across every worker
ENGINE_STATE = {
    "healthy": "healthy",
    "stale": "healthy",
    "cordoned": "draining",
    "down": "offline",
    "pending": "offline",
}


def utc_offset_hours(longitude: float) -> float:
    return round(longitude / 15.0)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class World:
    """The engine input plus the row ids needed to write the result back."""

    input: engine.PlacementInput
    """`current` names a deployment's standby replicas as the engine sees them
    (`<name>/standby`, see `controlplane.services.standby`)."""
    deployments: dict[str, m.Deployment] = field(default_factory=dict)
    clusters: dict[str, m.Cluster] = field(default_factory=dict)
    pools: dict[str, m.Pool] = field(default_factory=dict)
    placed: tuple[engine.Assignment, ...] = ()
    """The stored placement; `input.current` leaves out replicas that cannot start."""
    standbys: dict[str, Standby] = field(default_factory=dict)
    """Per active_passive deployment: what its standby cluster keeps warm."""
    reserved: list[Reserved] = field(default_factory=list)
    """GPUs held for running rollouts and shadows, already out of `input`'s pools
    (`controlplane.services.reservations`)."""


def place(world: World, inp: engine.PlacementInput | None = None) -> engine.PlacementResult:
    """The engine on ``inp`` (default: the world's input), standby replicas included
    (`controlplane.services.standby`)."""
    given = world.input if inp is None else inp
    return fold_standbys(engine.place(with_standbys(given, world.standbys)), world.standbys)


DEMAND_DEADBAND = 0.1
"""A summed demand within this fraction of what is placed (rounded down: none below ten
replicas) keeps the placed count: each plane rounds its own demand up, so their sum moves
by a few replicas that no plane needs."""


def planned_demand(demand: int, placed: int | None) -> int:
    """``demand``, unless it is within the deadband of ``placed`` (None: nothing placed)."""
    if placed is None or placed == 0:
        return demand
    return placed if abs(demand - placed) <= int(placed * DEMAND_DEADBAND) else demand


def wanted_replicas(deployment: m.Deployment, placed: int | None = None) -> int:
    """From the autoscalers' summed demand (deadbanded around ``placed``, see
    `planned_demand`), within [min, max]; a scale-to-zero deployment keeps room for one
    replica so that its first request can be served after a cold start."""
    auto = deployment_autoscaling(deployment)
    low, high = auto.min_replicas, auto.max_replicas
    floor = max(low, 1 if high >= 1 else 0)
    return max(floor, min(high, planned_demand(deployment.demand_replicas, placed)))


def _pool(row: m.Pool, now: datetime, held_gpus: int, usable: int | None = None) -> engine.Pool:
    """Capacity: the pool's declared `gpus` plus the GPUs of instances procurement holds,
    no more than `usable` (what its planes report, see `usable_gpus`). Procurable: what the
    quota (on-demand), the commitment (reserved) or the offer (spot) still allows, none
    while the pool is exhausted, over quota, failing or in an outage."""
    inventory = row.gpus + held_gpus
    capacity = inventory if usable is None else min(inventory, usable)
    procurable = 0
    if blocked_reason(row, now) is None:
        if row.purchase_type == "on_demand":
            procurable = max(0, (row.quota_gpus or 0) - inventory)
        elif row.purchase_type == "reserved":
            procurable = max(0, (row.committed_gpus or 0) - inventory)
        else:
            procurable = pool_status(row).spot_available_gpus or 0
    return engine.Pool(
        id=row.name,
        provider=row.provider.name,
        region=row.region.name,
        gpu_type=row.gpu_type.name,
        purchase=row.purchase_type,  # type: ignore[arg-type]
        capacity_gpus=capacity,
        price_per_gpu_hour=float(row.price_per_gpu_hour),
        procurable_gpus=procurable,
        interruption_rate_per_hour=float(row.interruptions_per_hour or 0),
        certifications=frozenset(row.provider.certifications),
        gpus_per_instance=row.gpus_per_instance,
    )


def _deployment(row: m.Deployment, placed: int | None = None) -> engine.Deployment:
    p = deployment_placement(row)
    return engine.Deployment(
        name=row.name,
        gpus_per_replica=row.gpus_per_replica,
        gpu_types=tuple(row.gpu_types),
        wanted_replicas=wanted_replicas(row, placed),
        min_replicas=deployment_autoscaling(row).min_replicas,
        policy=engine.PlacementPolicy(
            allowed_jurisdictions=frozenset(p.allowed_jurisdictions),
            allowed_regions=frozenset(p.allowed_regions),
            required_certifications=frozenset(p.required_certifications),
            spot_allowed=p.spot_allowed,
            max_spot_fraction=p.max_spot_fraction,
            min_distinct_providers=p.min_distinct_providers,
            min_distinct_regions=p.min_distinct_regions,
        ),
        priority=row.priority,
        traffic=dict(row.traffic or {}),
    )


def _cluster(row: m.Cluster) -> engine.Cluster:
    state = "cordoned" if cluster_status(row).cordoned else row.state
    return engine.Cluster(
        name=row.name,
        pool_ids=tuple(sorted(p.name for p in row.pools)),
        state=ENGINE_STATE.get(state, "offline"),  # type: ignore[arg-type]
    )


def load_world(session: Session, now: datetime | None = None) -> World:
    now = now or _now()
    pools = {p.name: p for p in session.scalars(select(m.Pool).order_by(m.Pool.name)).unique()}
    clusters = {
        c.name: c for c in session.scalars(select(m.Cluster).order_by(m.Cluster.name)).unique()
    }
    deployments = {
        d.name: d for d in session.scalars(select(m.Deployment).order_by(m.Deployment.name))
    }
    regions = session.scalars(select(m.Region).order_by(m.Region.name)).unique()
    held = held_gpus(session)
    names = {
        "deployment": {d.id: d.name for d in deployments.values()},
        "cluster": {c.id: c.name for c in clusters.values()},
        "pool": {p.id: p.name for p in pools.values()},
    }
    reports = reported_capacity(clusters)
    stored = [
        engine.Assignment(
            names["deployment"][row.deployment_id],
            names["cluster"][row.cluster_id],
            names["pool"][row.pool_id],
            row.replicas,
        )
        for row in session.scalars(select(m.Placement).order_by(m.Placement.id))
        if row.replicas > 0
    ]
    standbys = standbys_of(deployments, clusters)
    placed: dict[str, int] = defaultdict(int)  # active replicas: the standby has its own size
    for a in stored:
        if not is_standby(standbys, a.deployment, a.cluster):
            placed[a.deployment] += a.replicas
    current = tuple(
        replace(a, replicas=running_share(a, reports))
        for a in stored
        if running_share(a, reports) > 0
    )
    per_replica = {d.name: d.gpus_per_replica for d in deployments.values()}
    shadows = {n: s for n, d in deployments.items() if (s := shadow_of(d)) is not None}
    wanted = reservations(
        stored, per_replica, running_canaries(session, deployments.values()), shadows
    )
    running: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for a in current:
        running[a.pool][a.cluster] += a.replicas * per_replica[a.deployment]
    for pool, clusters_gpus in per_pool(wanted).items():  # the lanes run there too
        for cluster, gpus in clusters_gpus.items():
            running[pool][cluster] += gpus
    inp = engine.PlacementInput(
        regions=tuple(
            engine.Region(r.name, r.jurisdiction, utc_offset_hours(r.longitude)) for r in regions
        ),
        pools=tuple(
            _pool(
                p,
                now,
                held.get(p.id, 0),
                usable_gpus(p.gpus + held.get(p.id, 0), reports.get(p.name, {}), running[p.name]),
            )
            for p in pools.values()
        ),
        clusters=tuple(_cluster(c) for c in clusters.values()),
        deployments=tuple(_deployment(d, placed.get(d.name)) for d in deployments.values()),
        current=engine_current(current, standbys),
    )
    held_input, reserved = reserve(inp, wanted)
    return World(
        input=held_input,
        deployments=deployments,
        clusters=clusters,
        pools=pools,
        placed=tuple(stored),
        standbys=standbys,
        reserved=reserved,
    )


def summary(world: World, result: engine.PlacementResult) -> dict[str, Any]:
    """The placement as the API shows it: per deployment, where, why not, what it costs."""
    per_dep: dict[str, dict[str, Any]] = {}
    placed: dict[str, int] = defaultdict(int)
    for a in result.assignments:
        placed[a.deployment] += a.replicas
    standby: dict[str, int] = defaultdict(int)
    for a in result.assignments:
        if is_standby(world.standbys, a.deployment, a.cluster):
            standby[a.deployment] += a.replicas
    price = {p.id: p.price_per_gpu_hour for p in world.input.pools}
    held: dict[str, list[Reserved]] = defaultdict(list)
    for r in world.reserved:
        held[r.deployment].append(r)
    reserved_cost = sum(r.gpus * price.get(r.pool, 0.0) for r in world.reserved)
    for dep in world.input.deployments:
        extra = sum(r.gpus * price.get(r.pool, 0.0) for r in held[dep.name])
        per_dep[dep.name] = {
            "wanted_replicas": dep.target_replicas,
            "placed_replicas": placed.get(dep.name, 0) - standby.get(dep.name, 0),
            "cost_per_hour": f"{result.cost_per_hour.get(dep.name, 0.0) + extra:.6f}",
            "assignments": [
                {"cluster": a.cluster, "pool": a.pool, "replicas": a.replicas}
                for a in result.assignments
                if a.deployment == dep.name and not is_standby(world.standbys, dep.name, a.cluster)
            ],
            "standby_replicas": standby.get(dep.name, 0),
            "standby": [
                {"cluster": a.cluster, "pool": a.pool, "replicas": a.replicas}
                for a in result.assignments
                if a.deployment == dep.name and is_standby(world.standbys, dep.name, a.cluster)
            ],
            "reserved_gpus": sum(r.gpus for r in held[dep.name]),
            "reserved": [
                {"cluster": r.cluster, "pool": r.pool, "gpus": r.gpus, "reason": r.reason}
                for r in held[dep.name]
            ],
            "unplaced": [
                {
                    "replicas": u.replicas,
                    "constraint": u.constraint,
                    "reason": u.reason,
                    "displaced_by": u.displaced_by,
                }
                for u in result.unplaced
                if u.deployment == dep.name
            ],
        }
    return {
        "total_cost_per_hour": f"{result.total_cost_per_hour + reserved_cost:.6f}",
        "deployments": per_dep,
        "changes": [_change(c) for c in result.changes],
        "procurement": [
            {"pool": p.pool, "gpus": p.gpus, "instances": p.instances} for p in result.procurement
        ],
    }


def _change(c: engine.Change) -> dict[str, Any]:
    fields = {
        "kind": c.kind,
        "deployment": c.deployment,
        "replicas": c.replicas,
        "from_cluster": c.from_cluster,
        "from_pool": c.from_pool,
        "to_cluster": c.to_cluster,
        "to_pool": c.to_pool,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _min_shares(total_min: int, rows: list[engine.Assignment]) -> list[int]:
    """Spread a deployment's min replicas over its rows, largest rows first."""
    shares, left = [0] * len(rows), total_min
    for i in sorted(range(len(rows)), key=lambda i: -rows[i].replicas):
        shares[i] = min(rows[i].replicas, left)
        left -= shares[i]
    return shares


def apply_result(
    session: Session, world: World, result: engine.PlacementResult, reason: str
) -> dict[str, Any]:
    """Write the placement; returns the summary. Clusters whose share changed get a new
    desired generation (the bus process publishes them)."""
    before = {(a.deployment, a.cluster, a.pool): a.replicas for a in world.placed}
    after = {(a.deployment, a.cluster, a.pool): a.replicas for a in result.assignments}
    touched = {
        world.clusters[key[1]].id
        for key in before.keys() | after.keys()
        if before.get(key) != after.get(key)
    }
    # a quota change alone (e.g. replicas that became a standby, held at min = max) is news too
    quotas_before = {
        (r.deployment_id, r.cluster_id, r.pool_id): (r.replicas, r.min_replicas, r.max_replicas)
        for r in session.scalars(select(m.Placement))
    }
    quotas_after: dict[tuple[str, str, str], tuple[int, int, int]] = {}
    session.execute(delete(m.Placement))
    by_dep: dict[str, list[engine.Assignment]] = defaultdict(list)
    for a in result.assignments:
        by_dep[a.deployment].append(a)
    price = {p.id: p.price_per_gpu_hour for p in world.input.pools}
    for name, rows in by_dep.items():
        dep = world.deployments[name]
        active = [i for i, r in enumerate(rows) if not is_standby(world.standbys, name, r.cluster)]
        auto_min = deployment_autoscaling(dep).min_replicas
        low_of = dict(zip(active, _min_shares(auto_min, [rows[i] for i in active]), strict=True))
        for i, row in enumerate(rows):
            # a standby is kept warm at exactly its size: its plane's autoscaler keeps it
            low = low_of.get(i, row.replicas)
            cluster_id, pool_id = world.clusters[row.cluster].id, world.pools[row.pool].id
            quotas_after[(dep.id, cluster_id, pool_id)] = (row.replicas, low, row.replicas)
            session.add(
                m.Placement(
                    deployment_id=dep.id,
                    cluster_id=cluster_id,
                    pool_id=pool_id,
                    replicas=row.replicas,
                    min_replicas=low,
                    max_replicas=row.replicas,
                    cost_per_hour=Decimal(
                        f"{row.replicas * dep.gpus_per_replica * price[row.pool]:.6f}"
                    ),
                )
            )
    touched |= {
        key[1]
        for key in quotas_before.keys() | quotas_after.keys()
        if quotas_before.get(key) != quotas_after.get(key)
    }
    info = summary(world, result)
    explained_before = {n: _unplaced(d) for n, d in world.deployments.items()}
    for name, dep in world.deployments.items():
        set_status(dep, placement=info["deployments"].get(name, {}))
    explained_now = {n: _unplaced(d) for n, d in world.deployments.items()}
    bump_desired(session, touched)
    if touched or explained_now != explained_before:  # not every timer tick: only news
        session.add(
            m.Event(
                type="PlacementChanged" if touched else "PlacementUnchanged",
                object_kind="Placement",
                message=f"re-planned ({reason}): {len(result.changes)} change(s), "
                f"{sum(u.replicas for u in result.unplaced)} replica(s) unplaced, "
                f"${result.total_cost_per_hour:.2f}/h",
                data={
                    "reason": reason,
                    "changes": info["changes"],
                    "procurement": info["procurement"],
                },
            )
        )
    return info


def _unplaced(row: m.Deployment) -> list[dict[str, Any]] | None:
    placed = deployment_status(row).placement
    return None if placed is None else [u.model_dump() for u in placed.unplaced]


def held_gpus(session: Session, states: tuple[str, ...] = ACTIVE) -> dict[str, int]:
    """Pool id → GPUs of the instances procurement holds there in ``states`` (requested or
    running: what placement may use; the ledger counts every state the provider bills)."""
    rows = session.execute(
        select(m.Instance.pool_id, func.sum(m.Instance.gpus))
        .where(m.Instance.state.in_(states))
        .group_by(m.Instance.pool_id)
    ).all()
    return {pool_id: int(gpus or 0) for pool_id, gpus in rows}


def instance_gpus_wanted(world: World, result: engine.PlacementResult) -> dict[str, int]:
    """Per pool (every pool), the GPUs the placement uses beyond the pool's declared `gpus`:
    what procurement must hold as instances (and may release when it is less)."""
    per_replica = {d.name: d.gpus_per_replica for d in world.input.deployments}
    used: dict[str, int] = defaultdict(int)
    for a in result.assignments:
        used[a.pool] += a.replicas * per_replica[a.deployment]
    for r in world.reserved:  # rollout lanes and shadows run there too
        used[r.pool] += r.gpus
    return {row.id: max(0, used[name] - row.gpus) for name, row in world.pools.items()}


@dataclass
class Replanned:
    summary: dict[str, Any]
    actions: list[Any]
    """Procurement to dispatch once the transaction has committed."""


def replan(
    session: Session,
    reason: str,
    now: datetime | None = None,
    wait_s: float = 0.0,
    spend_limits: SpendLimits | None = None,
) -> Replanned | None:
    """One re-plan and its procurement decision in the caller's transaction; None when
    another re-plan holds the lock (after waiting up to `wait_s` for it: a trigger that
    arrives while another re-plan runs must still be planned, with what it changed)."""
    if wait_s > 0:
        session.execute(text(f"SET LOCAL lock_timeout = '{int(wait_s * 1000)}ms'"))
        try:
            with session.begin_nested():
                session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        except OperationalError:
            return None
        session.execute(text("SET LOCAL lock_timeout = DEFAULT"))  # the engine's bound
    elif not session.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": LOCK_KEY}):
        return None
    now = now or _now()
    world = load_world(session, now)
    limits = spend_limits or SpendLimits()  # reported demand is bounded before it is placed
    world.input, wishes = spend.guard(session, world.input, world.deployments, now, limits)
    result = place(world)
    spend.record(world.deployments, wishes, result, now, limits)
    info = apply_result(session, world, result, reason)
    actions = plan_procurement(session, instance_gpus_wanted(world, result), now)
    return Replanned(info, actions)


def current(session: Session) -> dict[str, Any]:
    """The stored placement and each deployment's last placement status (reasons, cost)."""
    world = load_world(session)
    placed = {name: deployment_status(d).placement for name, d in world.deployments.items()}
    deployments = {
        name: p.model_dump(mode="json") if p is not None else {} for name, p in placed.items()
    }
    total = sum(Decimal(p.cost_per_hour) for p in placed.values() if p is not None)
    assignments = [
        {"deployment": a.deployment, "cluster": a.cluster, "pool": a.pool, "replicas": a.replicas}
        for a in world.placed
    ]
    return {
        "total_cost_per_hour": f"{total:.6f}",
        "deployments": deployments,
        "assignments": assignments,
    }
