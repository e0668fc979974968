"""Celery tasks that carry procurement out: acquire, release, and the periodic sweeps
(interruption notices, offers and spot prices, reconcile with the provider's list).

Each step is load → provider call outside any transaction → record. An instance's
idempotency key is committed (a `requested` Instance row) before the provider is asked
for it, so a worker killed between the two reruns with the same key and the provider
returns the instance it already made. Adapters never retry; Throttled is retried here
with exponential backoff and full jitter. The `*_run` functions take `Deps` so tests and
benches call them directly with their own provider, clock and re-plan hook.
"""

from __future__ import annotations

import hashlib
import logging
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.models import Deployment, Instance, Placement, Pool
from controlplane.db.models import Provider as ProviderRow
from controlplane.db.session import transaction
from controlplane.providers_factory import ProviderCache, pool_ref
from controlplane.services import procurement as svc
from controlplane.services.procurement import Acquire, Action, Policy, Release
from controlplane.settings import get_settings
from controlplane.tasks import celery_app, sessions
from providers.base import Instance as ProviderInstance
from providers.base import (
    InsufficientCapacity,
    Provider,
    ProviderError,
    QuotaExceeded,
    Throttled,
)

log = logging.getLogger("gpufleet.procurement")


def _send_replan(reason: str) -> None:
    celery_app.send_task("gpufleet.replan", kwargs={"reason": reason})


@dataclass
class Deps:
    """What the tasks need from the outside world; `deps()` builds the process's own."""

    factory: sessionmaker[Session]
    providers: Callable[[ProviderRow], Provider]
    replan: Callable[[str], None] = _send_replan
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    policy: Policy = field(default_factory=Policy)


_override: list[Deps] = []


@cache
def _default_deps() -> Deps:
    return Deps(factory=sessions(), providers=ProviderCache(get_settings().data_dir))


def deps() -> Deps:
    return _override[-1] if _override else _default_deps()


@contextmanager
def using(d: Deps) -> Iterator[Deps]:
    """Run the Celery tasks of this process (`acquire.run(...)`) with `d`."""
    _override.append(d)
    try:
        yield d
    finally:
        _override.remove(d)


@dataclass
class Outcome:
    acquired: list[str] = field(default_factory=list)  # provider instance ids recorded
    error: str | None = None  # the ProviderError class name that stopped the work
    retry: bool = False  # Throttled: run again later with the same request id

    def as_dict(self) -> dict[str, Any]:
        return {"acquired": self.acquired, "error": self.error, "retry": self.retry}


# -- acquire -------------------------------------------------------------------------------


def acquire_run(
    d: Deps, pool_id: str, count: int, request_id: str, cluster_id: str | None = None
) -> Outcome:
    """Make `count` instances exist in the pool; keys derive from `request_id`."""
    with transaction(d.factory) as session:
        pool = session.get(Pool, pool_id)
        if pool is None:
            return Outcome(error="NotFound")
        cluster = cluster_id or svc.cluster_for(session, pool)
        rows = svc.add_requested(
            session, pool_id, cluster, request_id, count, pool.gpus_per_instance
        )
        todo = [(r.id, r.idempotency_key) for r in rows if r.state == "requested"]
    # committed: from here on a rerun reuses these keys
    return _launch(d, pool, todo)


def _launch(d: Deps, pool: Pool, todo: list[tuple[str, str]]) -> Outcome:
    out = Outcome()
    try:
        provider = d.providers(pool.provider)
        ref = pool_ref(pool)
    except ProviderError as exc:
        return _failed(d, pool.id, [row for row, _ in todo], exc)
    for n, (row_id, key) in enumerate(todo):
        try:
            with _key_lock(d.factory, key) as mine:
                if not mine:
                    continue  # another worker is launching this key right now
                made = provider.create_instances(ref, 1, key)
        except ProviderError as exc:
            failed = _failed(d, pool.id, [row for row, _ in todo[n:]], exc)
            failed.acquired = out.acquired
            return failed
        if _record_acquired(d, row_id, made):
            out.acquired.extend(i.id for i in made)
    return out


@contextmanager
def _key_lock(factory: sessionmaker[Session], key: str) -> Iterator[bool]:
    """A session-level advisory lock on the key, held on its own connection *outside* any
    transaction while the provider is called (Lambda has no server-side idempotency)."""
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


def _record_acquired(d: Deps, row_id: str, made: list[ProviderInstance]) -> bool:
    with transaction(d.factory) as session:
        row = session.get_one(Instance, row_id, with_for_update=True)
        if row.state != "requested" or not made:
            return False  # released meanwhile: the sweep deletes the orphan by its key
        row.provider_instance_id, row.state, row.error = made[0].id, "running", None
        pool = session.get_one(Pool, row.pool_id)
        svc.event(
            session,
            "InstanceAcquired",
            row,
            f"instance {made[0].id} ({made[0].instance_type}, {row.gpus} GPUs) acquired "
            f"in pool {pool.name}",
            pool=pool.name,
            key=row.idempotency_key,
        )
        return True


def _failed(d: Deps, pool_id: str, row_ids: list[str], exc: ProviderError) -> Outcome:
    """Record why the pool could not give instances; Throttled leaves rows for a retry."""
    now, policy, name = d.clock(), d.policy, type(exc).__name__
    with transaction(d.factory) as session:
        pool = session.get_one(Pool, pool_id, with_for_update={"of": Pool})
        rows = [session.get_one(Instance, r, with_for_update=True) for r in row_ids]
        error = {"error": name, "message": str(exc), "at": now.isoformat()}
        svc.update_status(pool, last_error=error)
        if isinstance(exc, Throttled):
            for row in rows:
                row.error = str(exc)
            return Outcome(error=name, retry=True)
        for row in rows:
            if row.state == "requested":
                row.state, row.error = "failed", str(exc)
        reason = _block(session, pool, exc, now, policy)
    d.replan(reason)
    return Outcome(error=name)


def _block(session: Session, pool: Pool, exc: ProviderError, now: datetime, policy: Policy) -> str:
    if isinstance(exc, InsufficientCapacity):
        until = now + timedelta(seconds=policy.exhausted_cooldown_s)
        svc.update_status(pool, exhausted_until=until.isoformat())
        svc.event(
            session,
            "PoolExhausted",
            pool,
            f"pool {pool.name} has no capacity now "
            f"({exc}); no new instances there until {until.isoformat()}, re-planning "
            "onto other pools",
            until=until.isoformat(),
        )
        return "capacity_exhausted"
    until = now + timedelta(seconds=policy.quota_cooldown_s)
    if isinstance(exc, QuotaExceeded):
        why = {"message": str(exc), "at": now.isoformat(), "until": until.isoformat()}
        svc.update_status(pool, quota_until=until.isoformat(), quota_exceeded=why)
        for dep in session.scalars(
            select(Deployment)
            .join(Placement, Placement.deployment_id == Deployment.id)
            .where(Placement.pool_id == pool.id)
        ):
            dep.status = {
                **(dep.status or {}),
                "procurement": {"pool": pool.name, "reason": "quota_exceeded", "message": str(exc)},
            }
        svc.event(
            session,
            "PoolQuotaExceeded",
            pool,
            f"pool {pool.name}: {exc}; not asked again before {until.isoformat()}",
            until=until.isoformat(),
        )
        return "quota_exceeded"
    svc.update_status(pool, failing_until=until.isoformat())
    svc.event(
        session,
        "ProcurementFailed",
        pool,
        f"pool {pool.name}: {exc}; not asked again before {until.isoformat()}",
        until=until.isoformat(),
    )
    return "procurement_failed"


# -- release -------------------------------------------------------------------------------


def release_run(d: Deps, instance_id: str) -> Outcome:
    """Give the instance back to the provider (silent if already gone)."""
    with transaction(d.factory) as session:
        row = session.get(Instance, instance_id, with_for_update=True)
        if row is None or row.state in ("released", "failed", "gone"):
            return Outcome()
        row.state = "releasing"
        pool = session.get_one(Pool, row.pool_id)
        pid, key = row.provider_instance_id, row.idempotency_key
    try:
        provider = d.providers(pool.provider)
        if pid is None:  # requested, maybe launched by a worker that died: find it by key
            pid = next((i.id for i in provider.list_instances() if i.idempotency_key == key), None)
        if pid is not None:
            provider.delete_instance(pid)
    except ProviderError as exc:
        with transaction(d.factory) as session:
            session.get_one(Instance, instance_id).error = str(exc)
        return Outcome(error=type(exc).__name__, retry=isinstance(exc, Throttled))
    with transaction(d.factory) as session:
        row = session.get_one(Instance, instance_id, with_for_update=True)
        row.state, row.idle_since = "released", None
        svc.event(
            session,
            "InstanceReleased",
            row,
            f"instance {pid} released from pool {pool.name}",
            pool=pool.name,
        )
    return Outcome()


# -- Celery --------------------------------------------------------------------------------


def _retry(task: Any, out: Outcome) -> dict[str, Any]:
    policy = deps().policy
    if out.retry and task.request.retries < policy.max_retries:
        delay = svc.backoff_s(
            task.request.retries, random.random(), policy.backoff_base_s, policy.backoff_cap_s
        )
        raise task.retry(countdown=delay)
    return out.as_dict()


@celery_app.task(
    name="gpufleet.acquire",
    bind=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=None,
)
def acquire(
    self: Any,
    pool_id: str,
    count: int,
    cluster_id: str | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """`count` instances in the pool. The request id (default: the Celery task id, which a
    retry or redelivery keeps) fixes the idempotency keys."""
    rid = request_id or self.request.id or str(uuid.uuid4())
    return _retry(self, acquire_run(deps(), pool_id, count, rid, cluster_id))


@celery_app.task(
    name="gpufleet.release",
    bind=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=None,
)
def release(self: Any, instance_id: str) -> dict[str, Any]:
    return _retry(self, release_run(deps(), instance_id))


def dispatch(actions: Iterable[Action], send: Callable[..., Any] | None = None) -> None:
    """Send the tasks for `plan_procurement`'s actions; call after its transaction commits."""
    send = send or celery_app.send_task
    for action in actions:
        if isinstance(action, Acquire):
            kwargs = {
                "pool_id": action.pool_id,
                "count": action.count,
                "cluster_id": action.cluster_id,
                "request_id": action.request_id,
            }
            send("gpufleet.acquire", kwargs=kwargs, task_id=action.request_id)
        elif isinstance(action, Release):
            send("gpufleet.release", kwargs={"instance_id": action.instance_id})


# -- periodic sweeps ------------------------------------------------------------------------


def _providers_with(session: Session, states: tuple[str, ...], spot_only: bool = False) -> list:
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


def poll_interruptions_run(d: Deps) -> list[str]:
    """Ask each provider holding spot instances for notices; newly draining instances
    trigger one re-plan at once. Returns the provider instance ids that began draining."""
    with transaction(d.factory) as session:
        rows = _providers_with(session, svc.ACTIVE, spot_only=True)
    newly: list[str] = []
    for row in rows:
        try:
            notices = d.providers(row).interruption_notices()
        except ProviderError as exc:
            log.warning("interruption notices of %s: %s", row.name, exc)
            continue
        if not notices:
            continue
        with transaction(d.factory) as session:
            for notice in notices:
                now = d.clock()
                if svc.note_interruption(
                    session,
                    notice.instance_id,
                    notice.deadline,
                    now,
                    f"provider {row.name}",
                    d.policy,
                ):
                    newly.append(notice.instance_id)
    if newly:
        d.replan("spot_interruption_noticed")
    return newly


def refresh_offers_run(d: Deps) -> int:
    """Offers and spot prices into `pool.status["offer"]`; returns the pools updated."""
    with transaction(d.factory) as session:
        rows = list(
            session.scalars(
                select(ProviderRow).join(Pool, Pool.provider_id == ProviderRow.id).distinct()
            )
        )
    updated = 0
    for row in rows:
        try:
            offers = d.providers(row).offers()
        except ProviderError as exc:
            log.warning("offers of %s: %s", row.name, exc)
            continue
        now = d.clock().isoformat()
        with transaction(d.factory) as session:
            for pool in session.scalars(select(Pool).where(Pool.provider_id == row.id)):
                offer = _best_offer(pool, offers)
                if offer is None:
                    svc.update_status(pool, offer={"available": False, "refreshed_at": now})
                    continue
                gpi = offer.gpus_per_instance
                spot = offer.spot_price / gpi if offer.spot_price is not None else None
                svc.update_status(
                    pool,
                    offer={
                        "instance_type": offer.instance_type,
                        "zone": offer.zone,
                        "on_demand_price": offer.on_demand_price,
                        "spot_price": offer.spot_price,
                        "available": offer.available,
                        "refreshed_at": now,
                    },
                    spot_price_per_gpu_hour=spot if pool.purchase_type == "spot" else None,
                    spot_available_gpus=_spot_room(pool, offer.available),
                )
                updated += 1
    return updated


def _spot_room(pool: Pool, available: bool) -> int | None:
    """What placement may plan to buy in a spot pool: the quota headroom (one instance
    without a quota) while the provider says the shape is available."""
    if pool.purchase_type != "spot":
        return None
    if not available:
        return 0
    held = int((pool.status or {}).get("held_gpus", 0))
    return max(0, pool.quota_gpus - held) if pool.quota_gpus is not None else pool.gpus_per_instance


def _best_offer(pool: Pool, offers: list[Any]) -> Any:
    from providers.gpus import gpu_type as normalize_gpu

    def fits(o: Any) -> bool:
        if o.region != pool.region.code or o.gpus_per_instance != pool.gpus_per_instance:
            return False
        if pool.instance_type:
            return o.instance_type == pool.instance_type
        return normalize_gpu(o.gpu_type) == normalize_gpu(pool.gpu_type.name)

    spot = pool.purchase_type == "spot"
    price = (lambda o: o.spot_price) if spot else (lambda o: o.on_demand_price)
    fitting = [o for o in offers if fits(o)]
    fitting.sort(key=lambda o: (not o.available, price(o) is None, price(o) or 0.0))
    return fitting[0] if fitting else None


def reconcile_run(d: Deps) -> dict[str, int]:
    """Level-based repair against each provider's list: adopt instances whose recording was
    lost, resume stale requests with their keys, mark vanished instances gone, finish
    releases, delete orphans (launched for a key we gave up). Re-plans when capacity moved."""
    counts = {"adopted": 0, "resumed": 0, "gone": 0, "released": 0, "orphans": 0}
    with transaction(d.factory) as session:
        rows = _providers_with(session, svc.HELD)
    for prow in rows:
        try:
            provider = d.providers(prow)
            listed = provider.list_instances()
        except ProviderError as exc:
            log.warning("list instances of %s: %s", prow.name, exc)
            continue
        plan = _reconcile_provider(d, prow.id, listed, counts)
        for instance_id in plan["release"]:
            release_run(d, instance_id)
            counts["released"] += 1
        for pool, todo in plan["resume"]:
            _launch(d, pool, todo)
            counts["resumed"] += len(todo)
        for pid in plan["orphans"]:
            try:
                provider.delete_instance(pid)
                counts["orphans"] += 1
            except ProviderError as exc:
                log.warning("orphan %s of %s: %s", pid, prow.name, exc)
    if counts["gone"]:
        d.replan("instance_gone")
    return counts


def _reconcile_provider(
    d: Deps, provider_id: str, listed: list[ProviderInstance], counts: dict[str, int]
) -> dict[str, Any]:
    now, policy = d.clock(), d.policy
    by_id = {i.id: i for i in listed}
    by_key = {i.idempotency_key: i for i in listed if i.idempotency_key}
    plan: dict[str, Any] = {"release": [], "resume": [], "orphans": []}
    resume: dict[str, list[tuple[str, str]]] = {}
    pools: dict[str, Pool] = {}
    with transaction(d.factory) as session:
        rows = session.scalars(
            select(Instance)
            .join(Pool, Pool.id == Instance.pool_id)
            .where(Pool.provider_id == provider_id)
        ).all()
        for row in rows:
            age = (now - row.updated_at).total_seconds()
            if row.state == "requested" and row.idempotency_key in by_key:
                made = by_key[row.idempotency_key]
                row.provider_instance_id, row.state = made.id, "running"
                svc.event(
                    session,
                    "InstanceAcquired",
                    row,
                    f"instance {made.id} adopted: launched for its key before a worker stopped",
                    key=row.idempotency_key,
                )
                counts["adopted"] += 1
            elif row.state == "requested" and age >= policy.stale_request_s:
                pools[row.pool_id] = session.get_one(Pool, row.pool_id)
                resume.setdefault(row.pool_id, []).append((row.id, row.idempotency_key))
            elif row.state in ("running", "draining") and row.provider_instance_id not in by_id:
                if age >= policy.gone_grace_s or row.state == "draining":
                    row.state = "gone"
                    svc.event(
                        session,
                        "InstanceGone",
                        row,
                        f"instance {row.provider_instance_id}"
                        " is no longer listed by its provider (reclaimed or deleted)",
                    )
                    counts["gone"] += 1
            elif row.state == "releasing" and age >= policy.stale_request_s:
                plan["release"].append(row.id)
            elif row.state in ("failed", "released", "gone"):
                orphan = by_key.get(row.idempotency_key)
                if orphan is not None:
                    plan["orphans"].append(orphan.id)
    plan["resume"] = [(pools[p], todo) for p, todo in resume.items()]
    return plan


@celery_app.task(name="gpufleet.poll_interruptions")
def poll_interruptions() -> list[str]:
    return poll_interruptions_run(deps())


@celery_app.task(name="gpufleet.refresh_offers")
def refresh_offers() -> int:
    return refresh_offers_run(deps())


@celery_app.task(name="gpufleet.reconcile_instances")
def reconcile_instances() -> dict[str, int]:
    return reconcile_run(deps())
