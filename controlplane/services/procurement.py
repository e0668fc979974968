"""Procurement decisions: which instances to acquire and release so that the instances held
in each pool carry what the placement uses there.

`decide()` is pure (clock passed in). `plan_procurement()` loads its inputs, keeps the idle
bookkeeping and writes a `requested` Instance row per instance to acquire, in the caller's
transaction, so that two plans never ask twice. Nothing here calls a provider; the
Celery tasks in `controlplane.procurement_tasks` carry the actions out.
Invariants: reserved instances are never released for idleness; a pool that is exhausted,
over quota or in an outage gets no new instances until its status says otherwise.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from controlplane.db.columns import autoscaling_from
from controlplane.db.models import Deployment, Event, Instance, Placement, Pool, Replica
from controlplane.services.desired import bump_desired

ACTIVE = ("requested", "running")  # capacity placement may use
HELD = ("requested", "running", "draining", "releasing")  # exists (or may) at the provider
KEY_NAMESPACE = uuid.UUID("5f3c2b9e-8d0a-4c1e-9a57-6b7f0e2d4c31")
PLAN_LOCK = 0x6770_7566_6C74  # pg advisory lock: one procurement plan at a time


class Policy(BaseSettings):
    """Procurement knobs, from `GPUFLEET_PROCUREMENT_*` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="GPUFLEET_PROCUREMENT_", frozen=True, extra="ignore"
    )
    exhausted_cooldown_s: float = 300.0  # InsufficientCapacity: no new instances for this long
    quota_cooldown_s: float = 1800.0  # QuotaExceeded / InvalidRequest: no new tries for this long
    default_scale_down_delay_s: float = 300.0
    unhealthy_drain_s: float = 120.0
    default_notice_s: float = 120.0
    outage_share: float = 0.5  # more than this share of a pool unhealthy at once = outage
    outage_min_instances: int = 2  # ... and at least this many (one bad node is not an outage)
    max_retries: int = 6  # Throttled: Celery retries with backoff, then the sweep resumes
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    stale_request_s: float = 300.0  # a `requested` row this old is resumed by the sweep
    gone_grace_s: float = 60.0  # an instance missing from list_instances this long is gone


@dataclass(frozen=True, slots=True)
class PoolView:
    id: str
    purchase_type: str
    gpus_per_instance: int
    limit_gpus: int | None  # quota (on-demand/spot) or commitment (reserved); None = no limit
    scale_down_delay_s: float
    cluster_id: str | None = None
    blocked: str | None = None  # exhausted | quota_exceeded | failing | outage: none new


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    pool_id: str
    state: str
    health: str
    gpus: int
    created_at: datetime
    idle_since: datetime | None = None
    drain_deadline: datetime | None = None
    busy: bool = False  # replicas run on it


@dataclass(frozen=True, slots=True)
class Acquire:
    pool_id: str
    count: int
    cluster_id: str | None = None
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kind: Literal["acquire"] = "acquire"


@dataclass(frozen=True, slots=True)
class Release:
    instance_id: str
    reason: str
    kind: Literal["release"] = "release"


Action = Acquire | Release


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    idle: frozenset[str]  # instances not needed now (their scale-down clock runs)
    blocked: Mapping[str, str]  # pool -> why it gets no instances although it needs some
    idle_reserved_gpus: Mapping[str, int]  # reserved pools: paid-for GPUs the plan leaves unused


def decide(
    pools: Iterable[PoolView],
    instances: Iterable[InstanceView],
    wanted: Mapping[str, int],
    now: datetime,
) -> Decision:
    """What to do so each pool holds the GPUs `wanted` (GPUs the placement *uses* there,
    for every pool: a pool missing from `wanted` uses none). Instances draining past their
    deadline are released, except unhealthy ones in a pool with an outage (kept for
    inspection, not replaced)."""
    by_pool: dict[str, list[InstanceView]] = defaultdict(list)
    for inst in instances:
        if inst.state in HELD:
            by_pool[inst.pool_id].append(inst)
    actions: list[Action] = []
    idle: set[str] = set()
    blocked: dict[str, str] = {}
    idle_reserved: dict[str, int] = {}
    for pool in pools:
        held = by_pool.get(pool.id, [])
        want = max(0, wanted.get(pool.id, 0))
        for inst in held:
            due = inst.drain_deadline is not None and inst.drain_deadline <= now
            kept = pool.blocked == "outage" and inst.health == "unhealthy"
            if inst.state == "draining" and due and not kept:
                actions.append(Release(inst.id, "drained"))
        active = [i for i in held if i.state in ACTIVE]
        have = sum(i.gpus for i in active)
        if pool.purchase_type == "reserved":
            paid = pool.limit_gpus if pool.limit_gpus is not None else have
            idle_reserved[pool.id] = max(0, paid - want)
        if want > have:
            count = _to_acquire(pool, held, want - have)
            if pool.blocked:
                blocked[pool.id] = pool.blocked
            elif count == 0:
                blocked[pool.id] = "quota_full"
            else:
                actions.append(Acquire(pool.id, count, pool.cluster_id))
            continue
        surplus = have - want
        for inst in sorted(active, key=lambda i: (i.busy, -i.created_at.timestamp())):
            if inst.state != "running" or inst.gpus > surplus:
                continue
            surplus -= inst.gpus
            idle.add(inst.id)
            if pool.purchase_type == "reserved" or inst.idle_since is None:
                continue
            if now - inst.idle_since >= timedelta(seconds=pool.scale_down_delay_s):
                actions.append(Release(inst.id, "idle"))
    return Decision(tuple(actions), frozenset(idle), blocked, idle_reserved)


def _to_acquire(pool: PoolView, held: list[InstanceView], missing_gpus: int) -> int:
    count = math.ceil(missing_gpus / pool.gpus_per_instance)
    if pool.limit_gpus is None:
        return count
    headroom = pool.limit_gpus - sum(i.gpus for i in held)
    return max(0, min(count, headroom // pool.gpus_per_instance))


def backoff_s(attempt: int, rand: float, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base x 2^attempt)).
    `rand` in [0, 1) is passed in so the function stays pure."""
    return rand * min(cap_s, base_s * 2**attempt)


def instance_key(request_id: str, index: int) -> str:
    """The idempotency key of instance `index` of one acquire request: the same request
    (a Celery retry or redelivery keeps its task id) always yields the same keys."""
    return str(uuid.uuid5(KEY_NAMESPACE, f"{request_id}:{index}"))


# -- loading and bookkeeping (caller's transaction) ---------------------------------------


def plan_procurement(
    session: Session, wanted: Mapping[str, int], now: datetime, policy: Policy | None = None
) -> list[Action]:
    """`wanted`: GPUs the placement uses per pool (id or name), every pool (missing = 0).
    Decide and record: `requested` rows for every Acquire (keys from its request id),
    idle clocks started or stopped, `held_gpus` / `idle_reserved_gpus` in pool status.
    Dispatch the returned actions *after* the transaction commits
    (`procurement_tasks.dispatch(actions)`)."""
    policy = policy or Policy()
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PLAN_LOCK})
    pools = list(session.scalars(select(Pool)))
    ids = {p.name: p.id for p in pools}  # placement names pools by name: accept both
    wanted = {ids.get(key, key): gpus for key, gpus in wanted.items()}
    rows = list(session.scalars(select(Instance).where(Instance.state.in_(HELD))))
    busy = set(session.scalars(select(Replica.instance_id).where(Replica.instance_id.is_not(None))))
    views = [pool_view(session, p, now, policy) for p in pools]
    decision = decide(views, [instance_view(r, r.id in busy) for r in rows], wanted, now)
    for row in rows:
        if row.id in decision.idle and row.idle_since is None:
            row.idle_since = now
        elif row.id not in decision.idle and row.idle_since is not None:
            row.idle_since = None
    gpi = {p.id: p.gpus_per_instance for p in pools}
    for action in decision.actions:
        if isinstance(action, Acquire):
            add_requested(
                session,
                action.pool_id,
                action.cluster_id,
                action.request_id,
                action.count,
                gpi[action.pool_id],
            )
    held: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.state in ACTIVE:
            held[row.pool_id] += row.gpus
    for pool in pools:
        update_status(
            pool,
            held_gpus=held[pool.id],
            idle_reserved_gpus=decision.idle_reserved_gpus.get(pool.id),
            blocked=decision.blocked.get(pool.id),
        )
    return list(decision.actions)


def pool_view(session: Session, pool: Pool, now: datetime, policy: Policy) -> PoolView:
    reserved = pool.purchase_type == "reserved"
    return PoolView(
        id=pool.id,
        purchase_type=pool.purchase_type,
        gpus_per_instance=pool.gpus_per_instance,
        limit_gpus=(pool.committed_gpus if reserved else pool.quota_gpus),
        scale_down_delay_s=_scale_down_delay(session, pool.id, policy),
        cluster_id=cluster_for(session, pool),
        blocked=blocked_reason(pool, now),
    )


def instance_view(row: Instance, busy: bool = False) -> InstanceView:
    return InstanceView(
        row.id,
        row.pool_id,
        row.state,
        row.health,
        row.gpus,
        row.created_at,
        row.idle_since,
        row.drain_deadline,
        busy,
    )


def blocked_reason(pool: Pool, now: datetime) -> str | None:
    status = pool.status or {}
    if status.get("outage"):
        return "outage"
    for reason, key in (
        ("exhausted", "exhausted_until"),
        ("quota_exceeded", "quota_until"),
        ("failing", "failing_until"),
    ):
        until = status.get(key)
        if until and datetime.fromisoformat(until) > now:
            return reason
    return None


def pool_capacity(session: Session, now: datetime) -> dict[str, tuple[int, int]]:
    """pool id -> (capacity_gpus, procurable_gpus) for `controlplane.placement.Pool`:
    GPUs of instances held and not draining, and what may still be bought: quota (reserved:
    commitment; neither set: the pool's `gpus`) minus held, 0 while the pool is exhausted,
    over quota or in an outage."""
    held = dict(
        session.execute(
            select(Instance.pool_id, func.sum(Instance.gpus))
            .where(Instance.state.in_(ACTIVE))
            .group_by(Instance.pool_id)
        ).all()
    )
    out = {}
    for pool in session.scalars(select(Pool)):
        have = int(held.get(pool.id) or 0)
        reserved = pool.purchase_type == "reserved"
        limit = pool.committed_gpus if reserved else pool.quota_gpus
        room = (limit if limit is not None else pool.gpus) - have
        out[pool.id] = (have, 0 if blocked_reason(pool, now) else max(0, room))
    return out


def wanted_from_placements(session: Session) -> dict[str, int]:
    """GPUs the last stored placement uses per pool (replicas x GPUs per replica)."""
    rows = session.execute(
        select(Placement.pool_id, func.sum(Placement.replicas * Deployment.gpus_per_replica))
        .join(Deployment, Deployment.id == Placement.deployment_id)
        .group_by(Placement.pool_id)
    ).all()
    return {pool_id: int(gpus or 0) for pool_id, gpus in rows}


def cluster_for(session: Session, pool: Pool) -> str | None:
    """The cluster that draws on `pool` (most placed replicas there, else the first linked)."""
    from controlplane.db.models import cluster_pools

    placed = session.scalar(
        select(Placement.cluster_id)
        .where(Placement.pool_id == pool.id, Placement.replicas > 0)
        .order_by(Placement.replicas.desc())
        .limit(1)
    )
    if placed:
        return placed
    return session.scalar(
        select(cluster_pools.c.cluster_id).where(cluster_pools.c.pool_id == pool.id).limit(1)
    )


def _scale_down_delay(session: Session, pool_id: str, policy: Policy) -> float:
    """The longest scale-down delay of the deployments placed on the pool."""
    delays = [
        autoscaling_from(auto).scale_down_delay_seconds
        for auto in session.scalars(
            select(Deployment.autoscaling)
            .join(Placement, Placement.deployment_id == Deployment.id)
            .where(Placement.pool_id == pool_id)
        )
    ]
    return max(delays, default=policy.default_scale_down_delay_s)


def add_requested(
    session: Session, pool_id: str, cluster_id: str | None, request_id: str, count: int, gpus: int
) -> list[Instance]:
    """The `requested` rows of one acquire request (created once; existing ones returned)."""
    keys = [instance_key(request_id, i) for i in range(count)]
    existing = {
        r.idempotency_key: r
        for r in session.scalars(select(Instance).where(Instance.idempotency_key.in_(keys)))
    }
    for key in keys:
        if key not in existing:
            existing[key] = Instance(
                pool_id=pool_id,
                cluster_id=cluster_id,
                idempotency_key=key,
                gpus=gpus,
                state="requested",
            )
            session.add(existing[key])
    session.flush()
    return [existing[k] for k in keys]


def update_status(pool: Pool, **values: Any) -> None:
    """Merge `values` into pool.status (None deletes a key); writes only on change."""
    status = dict(pool.status or {})
    for key, value in values.items():
        if value is None:
            status.pop(key, None)
        else:
            status[key] = value
    if status != (pool.status or {}):
        pool.status = status


def event(session: Session, type_: str, obj: Instance | Pool, message: str, **data: Any) -> None:
    """Record what happened to a pool or an instance. Every instance event is a change of
    state (acquired, draining, cordoned, released, gone), and the instance list is part of
    its cluster's desired state: that cluster gets a new desired generation."""
    if isinstance(obj, Instance) and obj.cluster_id is not None:
        bump_desired(session, [obj.cluster_id])
    kind = "Pool" if isinstance(obj, Pool) else "Instance"
    name = obj.name if isinstance(obj, Pool) else obj.provider_instance_id
    session.add(
        Event(
            type=type_,
            object_kind=kind,
            object_id=obj.id,
            object_name=name,
            message=message,
            data=data,
        )
    )


# -- facts (caller's transaction; each returns True when a re-plan should run) ------------


def find_instance(session: Session, ref: str) -> Instance | None:
    """By provider instance id (what agents and providers know) or by our own id."""
    found = session.scalars(
        select(Instance).where(Instance.provider_instance_id == ref).with_for_update()
    ).first()
    return found or session.get(Instance, ref, with_for_update=True)


def note_interruption(
    session: Session,
    ref: str,
    deadline: datetime | None,
    now: datetime,
    source: str,
    policy: Policy | None = None,
) -> bool:
    """A spot notice: the instance drains (placement no longer counts it) until `deadline`."""
    inst = find_instance(session, ref)
    if inst is None or inst.state not in ACTIVE:
        return False
    pool = session.get_one(Pool, inst.pool_id)
    notice = pool.notice_seconds or (policy or Policy()).default_notice_s
    until = deadline or now + timedelta(seconds=notice)
    inst.state, inst.drain_deadline = "draining", until
    event(
        session,
        "InstanceDraining",
        inst,
        f"instance {inst.provider_instance_id} in pool {pool.name} will be taken back at "
        f"{until.isoformat()} (spot interruption, from {source}); "
        "replicas move off it and a replacement is planned",
        reason="spot_interruption",
        source=source,
        pool=pool.name,
        deadline=until.isoformat(),
    )
    return True


def note_unhealthy(
    session: Session, ref: str, reason: str, now: datetime, policy: Policy | None = None
) -> bool:
    """A bad node: cordoned and drained, then replaced; too many bad nodes in one pool at
    once is a provider outage: the pool gets no replacements until an operator looks."""
    policy = policy or Policy()
    inst = find_instance(session, ref)
    if inst is None or inst.health == "unhealthy" or inst.state not in (*ACTIVE, "draining"):
        return False
    pool = session.get_one(Pool, inst.pool_id, with_for_update={"of": Pool})
    inst.health = "unhealthy"
    if inst.state in ACTIVE:
        inst.state = "draining"
        inst.drain_deadline = now + timedelta(seconds=policy.unhealthy_drain_s)
    event(
        session,
        "InstanceCordoned",
        inst,
        f"instance {inst.provider_instance_id} in pool {pool.name} is unhealthy ({reason}); "
        "cordoned, drained and replaced",
        reason=reason,
        pool=pool.name,
    )
    states = ("running", "draining")
    members = list(
        session.scalars(
            select(Instance).where(Instance.pool_id == pool.id, Instance.state.in_(states))
        )
    )
    bad = sum(1 for m in members if m.health == "unhealthy")
    share = bad / len(members) if members else 0.0
    outage = bad >= policy.outage_min_instances and share > policy.outage_share
    if outage and not (pool.status or {}).get("outage"):
        why = (
            f"{bad} of {len(members)} instances unhealthy at once (more than "
            f"{policy.outage_share:.0%}): a provider outage, not a bad node"
        )
        update_status(pool, outage={"since": now.isoformat(), "message": why})
        event(
            session,
            "PoolOutageSuspected",
            pool,
            f"pool {pool.name}: {why}; automatic replacement stopped. Clear "
            "status.outage (procurement.clear_outage) once the provider recovers",
            unhealthy=bad,
            instances=len(members),
        )
    return True


def clear_outage(session: Session, pool_id: str) -> None:
    pool = session.get_one(Pool, pool_id, with_for_update={"of": Pool})
    update_status(pool, outage=None)
    event(session, "PoolOutageCleared", pool, f"pool {pool.name}: outage cleared")
