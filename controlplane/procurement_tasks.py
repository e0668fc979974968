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
from providers.base import (
    InsufficientCapacity,
    InvalidRequest,
    Provider,
    ProviderError,
    PurchaseType,
    QuotaExceeded,
    Throttled,
)
from providers.base import Instance as ProviderInstance

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
        rows = svc.add_requested(session, pool_id, cluster, request_id, count,
                                 pool.gpus_per_instance)  # fmt: skip
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
        svc.event(session, "InstanceAcquired", row,
                  f"instance {made[0].id} ({made[0].instance_type}, {row.gpus} GPUs) acquired "
                  f"in pool {pool.name}", pool=pool.name, key=row.idempotency_key)  # fmt: skip
        return True


def _failed(d: Deps, pool_id: str, row_ids: list[str], exc: ProviderError) -> Outcome:
    """Record why the pool could not give instances; Throttled leaves rows for a retry."""
    now, policy, name = d.clock(), d.policy, type(exc).__name__
    with transaction(d.factory) as session:
        pool = session.get_one(Pool, pool_id, with_for_update=True)
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
        svc.event(session, "PoolExhausted", pool, f"pool {pool.name} has no capacity now "
                  f"({exc}); no new instances there until {until.isoformat()}, re-planning "
                  "onto other pools", until=until.isoformat())  # fmt: skip
        return "capacity_exhausted"
    until = now + timedelta(seconds=policy.quota_cooldown_s)
    if isinstance(exc, QuotaExceeded):
        why = {"message": str(exc), "at": now.isoformat(), "until": until.isoformat()}
        svc.update_status(pool, quota_until=until.isoformat(), quota_exceeded=why)
        for dep in session.scalars(select(Deployment).join(
                Placement, Placement.deployment_id == Deployment.id).where(
                Placement.pool_id == pool.id)):  # fmt: skip
            dep.status = {**(dep.status or {}), "procurement": {"pool": pool.name,
                          "reason": "quota_exceeded", "message": str(exc)}}  # fmt: skip
        svc.event(session, "PoolQuotaExceeded", pool, f"pool {pool.name}: {exc}; not asked "
                  f"again before {until.isoformat()}", until=until.isoformat())  # fmt: skip
        return "quota_exceeded"
    svc.update_status(pool, failing_until=until.isoformat())
    svc.event(session, "ProcurementFailed", pool, f"pool {pool.name}: {exc}; not asked again "
              f"before {until.isoformat()}", until=until.isoformat())  # fmt: skip
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
        svc.event(session, "InstanceReleased", row, f"instance {pid} released from pool "
                  f"{pool.name}", pool=pool.name)  # fmt: skip
    return Outcome()


# -- Celery --------------------------------------------------------------------------------


def _retry(task: Any, out: Outcome) -> dict[str, Any]:
    policy = deps().policy
    if out.retry and task.request.retries < policy.max_retries:
        delay = svc.backoff_s(task.request.retries, random.random(), policy.backoff_base_s,
                              policy.backoff_cap_s)  # fmt: skip
        raise task.retry(countdown=delay)
    return out.as_dict()


@celery_app.task(name="gpufleet.acquire", bind=True, autoretry_for=(OperationalError,),
                 retry_backoff=True, retry_jitter=True, max_retries=None)  # fmt: skip
def acquire(
    self: Any, pool_id: str, count: int, cluster_id: str | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`count` instances in the pool. The request id (default: the Celery task id, which a
    retry or redelivery keeps) fixes the idempotency keys."""
    rid = request_id or self.request.id or str(uuid.uuid4())
    return _retry(self, acquire_run(deps(), pool_id, count, rid, cluster_id))


@celery_app.task(name="gpufleet.release", bind=True, autoretry_for=(OperationalError,),
                 retry_backoff=True, retry_jitter=True, max_retries=None)  # fmt: skip
def release(self: Any, instance_id: str) -> dict[str, Any]:
    return _retry(self, release_run(deps(), instance_id))


def dispatch(actions: Iterable[Action], send: Callable[..., Any] | None = None) -> None:
    """Send the tasks for `plan_procurement`'s actions; call after its transaction commits."""
    send = send or celery_app.send_task
    for action in actions:
        if isinstance(action, Acquire):
            kwargs = {"pool_id": action.pool_id, "count": action.count,
                      "cluster_id": action.cluster_id, "request_id": action.request_id}  # fmt: skip
            send("gpufleet.acquire", kwargs=kwargs, task_id=action.request_id)
        elif isinstance(action, Release):
            send("gpufleet.release", kwargs={"instance_id": action.instance_id})
