"""Procurement's SQL: load what `core` decides on, record what was decided and what the
providers did (instance rows, idempotency keys, pool status, events).

Every function runs in the caller's transaction (`key_lock` excepted: its own connection)
and none calls a provider. `plan_procurement` writes a `requested` Instance row per
instance to acquire before anything is sent, so two plans never ask twice and a worker
killed after the provider call reruns with the same keys.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.columns import autoscaling_from, pool_status, set_status
from controlplane.db.models import (
    Deployment,
    Event,
    Instance,
    Placement,
    Pool,
    Replica,
    cluster_pools,
)
from controlplane.db.models import Provider as ProviderRow
from controlplane.procurement.core import (
    ACTIVE,
    HELD,
    Acquire,
    Action,
    Adopt,
    Backoff,
    Blocked,
    InstanceView,
    Policy,
    PoolView,
    decide,
    instance_key,
)
from controlplane.services.desired import bump_desired
from providers.base import Instance as ProviderInstance

PLAN_LOCK = 0x6770_7566_6C74  # pg advisory lock: one procurement plan at a time
UNTIL: dict[Blocked, str] = {  # a block and the pool.status key saying until when
    "exhausted": "exhausted_until",
    "quota_exceeded": "quota_until",
    "failing": "failing_until",
}

log = logging.getLogger(__name__)


# -- plans ---------------------------------------------------------------------------------


def plan_procurement(
    session: Session, wanted: Mapping[str, int], now: datetime, policy: Policy | None = None
) -> list[Action]:
    """`wanted`: GPUs the placement uses per pool (id or name), every pool (missing = 0).
    Decide and record: `requested` rows for every Acquire (keys from its request id),
    idle clocks started or stopped, `held_gpus` / `idle_reserved_gpus` / `blocked` in pool
    status. Dispatch the returned actions *after* the transaction commits."""
    policy = policy or Policy()
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PLAN_LOCK})
    # read afresh: a re-plan loaded these rows (load_world) before it placed, and an
    # acquire's failure or an outage written meanwhile (`exhausted_until`, `outage`) would
    # be written back over with the old status
    pools = list(session.scalars(select(Pool).execution_options(populate_existing=True)))
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
            add_requested(session, action, gpi[action.pool_id])
    held: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.state in ACTIVE:
            held[row.pool_id] += row.gpus
    for pool in pools:
        set_status(
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
        id=row.id,
        pool_id=row.pool_id,
        state=row.state,
        health=row.health,
        gpus=row.gpus,
        created_at=row.created_at,
        idle_since=row.idle_since,
        drain_deadline=row.drain_deadline,
        busy=busy,
        idempotency_key=row.idempotency_key,
        provider_instance_id=row.provider_instance_id,
        updated_at=row.updated_at,
    )


def blocked_reason(pool: Pool, now: datetime) -> Blocked | None:
    """Why the pool gets no new instances now (its status), or None."""
    status = pool_status(pool)
    if status.outage is not None:
        return "outage"
    for reason, key in UNTIL.items():
        until: datetime | None = getattr(status, key)
        if until is not None and until > now:
            return reason
    return None


def cluster_for(session: Session, pool: Pool) -> str | None:
    """The cluster that draws on `pool` (most placed replicas there, else the first linked)."""
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


def add_requested(session: Session, acquire: Acquire, gpus: int) -> list[Instance]:
    """The `requested` rows of one acquire request, `gpus` each (created once; existing
    ones returned): the keys derive from its request id."""
    keys = [instance_key(acquire.request_id, i) for i in range(acquire.count)]
    existing = {
        r.idempotency_key: r
        for r in session.scalars(select(Instance).where(Instance.idempotency_key.in_(keys)))
    }
    for key in keys:
        if key not in existing:
            existing[key] = Instance(
                pool_id=acquire.pool_id,
                cluster_id=acquire.cluster_id,
                idempotency_key=key,
                gpus=gpus,
                state="requested",
            )
            session.add(existing[key])
    session.flush()
    return [existing[k] for k in keys]


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


# -- acquire and release -------------------------------------------------------------------


@contextmanager
def key_lock(factory: sessionmaker[Session], key: str) -> Iterator[bool]:
    """A session-level advisory lock on the key, held on its own connection *outside* any
    transaction while the provider is called (Lambda has no server-side idempotency).
    Yields False when another worker holds it."""
    ident = int.from_bytes(
        hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True
    )
    engine = factory.kw["bind"]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        mine = bool(conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": ident}))
        try:
            yield mine
        finally:
            if mine:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ident})


def record_acquired(session: Session, row_id: str, made: list[ProviderInstance]) -> bool:
    """The provider made the row's instance: running, with its provider id. False when
    the row left `requested` meanwhile (the reconcile sweep deletes the orphan by key)."""
    row = session.get_one(Instance, row_id, with_for_update=True)
    if row.state != "requested" or not made:
        return False
    row.provider_instance_id, row.state, row.error = made[0].id, "running", None
    pool = session.get_one(Pool, row.pool_id)
    event(
        session,
        "InstanceAcquired",
        row,
        f"instance {made[0].id} ({made[0].instance_type}, {row.gpus} GPUs) acquired "
        f"in pool {pool.name}",
        pool=pool.name,
        key=row.idempotency_key,
    )
    return True


def record_failure(
    session: Session,
    pool_id: str,
    row_ids: list[str],
    exc: Exception,
    backoff: Backoff,
    now: datetime,
) -> None:
    """An acquire failed with `exc` (`backoff`: `core.on_failure`'s verdict): the error on
    the pool and its rows; unless retried, the rows `failed` and the pool blocked."""
    pool = session.get_one(Pool, pool_id, with_for_update={"of": Pool})
    rows = [session.get_one(Instance, r, with_for_update=True) for r in row_ids]
    set_status(
        pool, last_error={"error": backoff.error, "message": str(exc), "at": now.isoformat()}
    )
    if backoff.retry:
        for row in rows:
            row.error = str(exc)
        return
    for row in rows:
        if row.state == "requested":
            row.state, row.error = "failed", str(exc)
    if backoff.block is not None and backoff.until is not None:
        _block(session, pool, backoff.block, backoff.until, exc, now)


def give_up(session: Session, row_ids: Sequence[str], why: str) -> int:
    """Requests the sweep will not resume (their pool is blocked): `failed`, so they no
    longer count as capacity on its way; the plan asks again once the block is over, if
    it still wants them. An instance a provider makes later under one of their keys is an
    orphan, deleted by the sweep. How many were given up."""
    given = 0
    for row_id in row_ids:
        row = session.get(Instance, row_id, with_for_update=True)
        if row is not None and row.state == "requested":
            row.state, row.error = "failed", why[:255]
            given += 1
    return given


def _block(
    session: Session, pool: Pool, block: Blocked, until: datetime, exc: Exception, now: datetime
) -> None:
    when = until.isoformat()
    if block == "exhausted":
        set_status(pool, exhausted_until=when)
        event(
            session,
            "PoolExhausted",
            pool,
            f"pool {pool.name} has no capacity now ({exc}); no new instances there until "
            f"{when}, re-planning onto other pools",
            until=when,
        )
    elif block == "quota_exceeded":
        why = {"message": str(exc), "at": now.isoformat(), "until": when}
        set_status(pool, quota_until=when, quota_exceeded=why)
        for dep in session.scalars(
            select(Deployment)
            .join(Placement, Placement.deployment_id == Deployment.id)
            .where(Placement.pool_id == pool.id)
        ):
            set_status(
                dep,
                procurement={"pool": pool.name, "reason": "quota_exceeded", "message": str(exc)},
            )
        event(
            session,
            "PoolQuotaExceeded",
            pool,
            f"pool {pool.name}: {exc}; not asked again before {when}",
            until=when,
        )
    else:
        set_status(pool, failing_until=when)
        event(
            session,
            "ProcurementFailed",
            pool,
            f"pool {pool.name}: {exc}; not asked again before {when}",
            until=when,
        )


def begin_release(
    session: Session, instance_id: str, reason: str | None = None
) -> tuple[Pool, str | None, str] | None:
    """Mark the row `releasing`: its pool, provider instance id and key; None when there
    is nothing to give back — or, for an `idle` release, when the instance is no longer
    idle (the plan that found it idle was overtaken while the task waited: load came back,
    a replica landed on it)."""
    row = session.get(Instance, instance_id, with_for_update=True)
    if row is None or row.state in ("released", "failed", "gone"):
        return None
    if row.state == "releasing":  # a retry (the provider throttled the first try): go on
        pool = session.get_one(Pool, row.pool_id)
        return pool, row.provider_instance_id, row.idempotency_key
    if reason == "idle" and (
        row.state != "running"
        or row.idle_since is None
        or session.scalar(select(Replica.id).where(Replica.instance_id == row.id).limit(1))
    ):
        log.info("instance %s is no longer idle: not released", row.provider_instance_id)
        return None
    row.state = "releasing"
    pool = session.get_one(Pool, row.pool_id)
    return pool, row.provider_instance_id, row.idempotency_key


def record_released(session: Session, instance_id: str, pid: str | None, pool: Pool) -> None:
    row = session.get_one(Instance, instance_id, with_for_update=True)
    row.state, row.idle_since = "released", None
    event(
        session,
        "InstanceReleased",
        row,
        f"instance {pid} released from pool {pool.name}",
        pool=pool.name,
    )


def record_release_error(session: Session, instance_id: str, exc: Exception) -> None:
    """The provider did not take the instance back (it is billed on): logged and an event on
    its pool once per distinct error (the sweep retries every 30 s)."""
    row = session.get_one(Instance, instance_id)
    error = f"{type(exc).__name__}: {exc}"[:500]
    if row.error != error:
        pool = session.get_one(Pool, row.pool_id)
        log.warning("instance %s not released: %s", row.provider_instance_id, error)
        event(
            session,
            "InstanceReleaseFailed",
            pool,
            f"instance {row.provider_instance_id} of pool {pool.name} not released ({error}); "
            "it is billed until a retry succeeds",
            instance=row.provider_instance_id,
        )
    row.error = error


# -- sweeps --------------------------------------------------------------------------------


def providers_holding(
    session: Session, states: tuple[str, ...], spot_only: bool = False
) -> list[ProviderRow]:
    """Providers with instances in `states` (in spot pools only, if asked)."""
    query = (
        select(ProviderRow)
        .distinct()
        .join(Pool, Pool.provider_id == ProviderRow.id)
        .join(Instance, Instance.pool_id == Pool.id)
        .where(Instance.state.in_(states))
    )
    if spot_only:
        query = query.where(Pool.purchase_type == "spot")
    return list(session.scalars(query))


def providers_with_pools(session: Session) -> list[ProviderRow]:
    return list(
        session.scalars(
            select(ProviderRow).join(Pool, Pool.provider_id == ProviderRow.id).distinct()
        )
    )


def instances_of(session: Session, provider_id: str) -> list[InstanceView]:
    """Every instance row (all states) in the provider's pools, for `core.repair`."""
    rows = session.scalars(
        select(Instance)
        .join(Pool, Pool.id == Instance.pool_id)
        .where(Pool.provider_id == provider_id)
    )
    return [instance_view(r) for r in rows]


def record_adopted(session: Session, adopt: Adopt) -> bool:
    """A requested row whose key the provider already has (a worker died after the call)
    becomes running with that instance; False if the row left `requested` meanwhile."""
    row = session.get_one(Instance, adopt.row_id, with_for_update=True)
    if row.state != "requested":
        return False
    row.provider_instance_id, row.state = adopt.provider_instance_id, "running"
    event(
        session,
        "InstanceAcquired",
        row,
        f"instance {adopt.provider_instance_id} adopted: launched for its key before a "
        "worker stopped",
        key=row.idempotency_key,
    )
    return True


def record_gone(session: Session, row_id: str) -> bool:
    """The provider no longer lists the row's instance; False if the row moved on since
    (released, or already gone)."""
    row = session.get_one(Instance, row_id, with_for_update=True)
    if row.state not in ("running", "draining"):
        return False
    row.state = "gone"
    event(
        session,
        "InstanceGone",
        row,
        f"instance {row.provider_instance_id} is no longer listed by its provider "
        "(reclaimed or deleted)",
    )
    return True
