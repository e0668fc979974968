"""The Celery tasks that carry procurement out: acquire, release, and the periodic sweeps
(interruption notices, offers and spot prices, repair against the provider's list).

Each step is load (one transaction) → decide (`core`, outside it) → provider calls outside
any transaction → record (one transaction). An instance's idempotency key is committed (a
`requested` row) before the provider is asked for it, so a worker killed between the two
reruns with the same key and the provider returns the instance it already made. Adapters
never retry; Throttled is retried here with exponential backoff and full jitter.

The `*_run` functions take their `Deps`; `register(app, deps)` binds the Celery tasks to
the `deps` the worker's composition root (`controlplane.tasks`) builds, or a test's own.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from prometheus_client import Counter
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.models import Pool
from controlplane.db.models import Provider as ProviderRow
from controlplane.db.session import transaction
from controlplane.procurement import facts, offers, store
from controlplane.procurement.adapters import pool_ref
from controlplane.procurement.core import (
    ACTIVE,
    Acquire,
    Action,
    Policy,
    Release,
    on_failure,
    repair,
    retry_in_s,
)
from providers.base import Provider, ProviderError, Throttled, Unavailable

log = logging.getLogger("gpufleet.procurement")

ACQUIRE = "gpufleet.acquire"
RELEASE = "gpufleet.release"
POLL_INTERRUPTIONS = "gpufleet.poll_interruptions"
RECONCILE_INSTANCES = "gpufleet.reconcile_instances"
REFRESH_OFFERS = "gpufleet.refresh_offers"


@dataclass
class Deps:
    """What the tasks need from the outside world."""

    factory: sessionmaker[Session]
    providers: Callable[[ProviderRow], Provider]
    replan: Callable[[str], None]  # ask for a re-plan (`controlplane.tasks.request_replan`)
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    policy: Policy = field(default_factory=Policy)


OUTCOMES = Counter(
    "gpufleet_procurement_outcomes_total",
    "Acquire and release runs by provider and outcome (ok, failed, throttled); `error` is "
    "the provider error's class (none when ok)",
    ["provider", "action", "outcome", "error"],
)


@dataclass
class Outcome:
    acquired: list[str] = field(default_factory=list)  # provider instance ids recorded
    error: str | None = None  # the ProviderError class name that stopped the work
    retry: bool = False  # Throttled: run again later with the same request id
    provider: str = ""  # the provider's name, for the metrics ("" when nothing was asked)

    def count(self, action: str) -> None:
        if not self.provider:
            return
        outcome = "throttled" if self.retry else "failed" if self.error else "ok"
        OUTCOMES.labels(self.provider, action, outcome, self.error or "none").inc()

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
        cluster = cluster_id or store.cluster_for(session, pool)
        request = Acquire(pool_id, count, cluster, request_id)
        rows = store.add_requested(session, request, pool.gpus_per_instance)
        todo = [(r.id, r.idempotency_key) for r in rows if r.state == "requested"]
    # committed: from here on a rerun reuses these keys
    return _launch(d, pool, todo)


def _launch(d: Deps, pool: Pool, todo: list[tuple[str, str]]) -> Outcome:
    out = Outcome(provider=pool.provider.name)
    try:
        provider = d.providers(pool.provider)
        ref = pool_ref(pool)
    except ProviderError as exc:
        failed = _failed(d, pool.id, [row for row, _ in todo], exc)
        failed.provider = out.provider
        return failed
    for n, (row_id, key) in enumerate(todo):
        try:
            with store.key_lock(d.factory, key) as mine:
                if not mine:
                    continue  # another worker is launching this key right now
                made = provider.create_instances(ref, 1, key)
        except ProviderError as exc:
            failed = _failed(d, pool.id, [row for row, _ in todo[n:]], exc)
            failed.acquired, failed.provider = out.acquired, out.provider
            return failed
        with transaction(d.factory) as session:
            recorded = store.record_acquired(session, row_id, made)
        if recorded:
            out.acquired.extend(i.id for i in made)
    return out


def _failed(d: Deps, pool_id: str, row_ids: list[str], exc: ProviderError) -> Outcome:
    """Record why the pool could not give instances; Throttled leaves rows for a retry."""
    now = d.clock()
    backoff = on_failure(exc, now, d.policy)
    with transaction(d.factory) as session:
        store.record_failure(session, pool_id, row_ids, exc, backoff, now)
    if backoff.replan is not None:
        d.replan(backoff.replan)
    return Outcome(error=backoff.error, retry=backoff.retry)


# -- release -------------------------------------------------------------------------------


def release_run(d: Deps, instance_id: str, reason: str | None = None) -> Outcome:
    """Give the instance back to the provider (silent if already gone; an `idle` release
    only if it still is idle)."""
    with transaction(d.factory) as session:
        begun = store.begin_release(session, instance_id, reason)
    if begun is None:
        return Outcome()
    pool, pid, key = begun
    try:
        provider = d.providers(pool.provider)
        if pid is None:  # requested, maybe launched by a worker that died: find it by key
            pid = next((i.id for i in provider.list_instances() if i.idempotency_key == key), None)
        if pid is not None:
            provider.delete_instance(pid)
    except ProviderError as exc:
        with transaction(d.factory) as session:
            store.record_release_error(session, instance_id, exc)
        return Outcome(
            error=type(exc).__name__,
            retry=isinstance(exc, Throttled | Unavailable),
            provider=pool.provider.name,
        )
    with transaction(d.factory) as session:
        store.record_released(session, instance_id, pid, pool)
    return Outcome(provider=pool.provider.name)


def dispatch(actions: Iterable[Action], send: Callable[..., Any]) -> None:
    """Send the tasks for `plan_procurement`'s actions through `send` (Celery's
    `send_task`); call it after the plan's transaction commits: an acquire run before
    that waits on the plan's uncommitted rows."""
    for action in actions:
        if isinstance(action, Acquire):
            kwargs = {
                "pool_id": action.pool_id,
                "count": action.count,
                "cluster_id": action.cluster_id,
                "request_id": action.request_id,
            }
            send(ACQUIRE, kwargs=kwargs, task_id=action.request_id)
        elif isinstance(action, Release):
            send(RELEASE, kwargs={"instance_id": action.instance_id, "reason": action.reason})


# -- periodic sweeps -----------------------------------------------------------------------


def _skipped(row: ProviderRow, doing: str, exc: Exception) -> None:
    """A sweep goes on to the next provider: a typed error is a warning, anything else (a
    transport error an adapter let through, a configuration its constructor refused) is
    logged with its traceback."""
    if isinstance(exc, ProviderError):
        log.warning("%s of %s: %s", doing, row.name, exc)
    else:
        log.error("%s of %s failed: %r", doing, row.name, exc, exc_info=exc)


def single_flight(d: Deps, sweep: str) -> AbstractContextManager[bool]:
    """One run of `sweep` at a time across the workers (a session-level advisory lock): a
    run still waiting on a slow provider makes the next one return at once, instead of
    both holding a worker (and asking the provider twice)."""
    return store.key_lock(d.factory, f"sweep-{sweep}")


def poll_interruptions_run(d: Deps) -> list[str]:
    """Ask each provider holding spot instances for notices; newly draining instances
    trigger one re-plan at once. Returns the provider instance ids that began draining."""
    with single_flight(d, "interruptions") as mine:
        return _poll_interruptions(d) if mine else []


def _poll_interruptions(d: Deps) -> list[str]:
    with transaction(d.factory) as session:
        rows = store.providers_holding(session, ACTIVE, spot_only=True)
    newly: list[str] = []
    for row in rows:
        try:
            notices = d.providers(row).interruption_notices()
        except Exception as exc:  # one provider down or broken: the others still polled
            _skipped(row, "interruption notices", exc)
            continue
        if not notices:
            continue
        with transaction(d.factory) as session:
            for notice in notices:
                source = f"provider {row.name}"
                deadline, now = notice.deadline, d.clock()
                if facts.note_interruption(
                    session, notice.instance_id, deadline, now, source, d.policy
                ):
                    newly.append(notice.instance_id)
    if newly:
        d.replan("spot_interruption_noticed")
    return newly


def refresh_offers_run(d: Deps) -> int:
    """Offers and spot prices into `pool.status["offer"]`; returns the pools updated."""
    with single_flight(d, "offers") as mine:
        return _refresh_offers(d) if mine else 0


def _refresh_offers(d: Deps) -> int:
    with transaction(d.factory) as session:
        rows = store.providers_with_pools(session)
    updated = 0
    for row in rows:
        try:
            listed = d.providers(row).offers()
        except Exception as exc:
            _skipped(row, "offers", exc)
            continue
        with transaction(d.factory) as session:
            updated += offers.record(session, row.id, listed, d.clock())
    return updated


def reconcile_run(d: Deps) -> dict[str, int]:
    """Level-based repair against each provider's list (`core.repair`): adopt instances
    whose recording was lost, resume stale requests with their keys (those of a blocked
    pool are given up), mark vanished
    instances gone, finish releases, delete orphans (launched for a key we gave up).
    Re-plans when capacity moved."""
    counts = {"adopted": 0, "resumed": 0, "given_up": 0, "gone": 0, "released": 0, "orphans": 0}
    with single_flight(d, "reconcile") as mine:
        if mine:
            _reconcile(d, counts)
    return counts


def _reconcile(d: Deps, counts: dict[str, int]) -> None:
    with transaction(d.factory) as session:  # all, not only those holding: orphans too
        rows = store.providers_with_pools(session)
    for prow in rows:
        # the time of the listing, not of after it: a worker frozen between the two took
        # an instance acquired meanwhile (not listed then) for one gone past its grace
        listed_at = d.clock()
        try:
            provider = d.providers(prow)
            listed = provider.list_instances()
        except Exception as exc:
            _skipped(prow, "list instances", exc)
            continue
        with transaction(d.factory) as session:
            instances = store.instances_of(session, prow.id)
        todo = repair(instances, listed, listed_at, d.policy)
        with transaction(d.factory) as session:
            counts["adopted"] += sum(store.record_adopted(session, a) for a in todo.adopt)
            counts["gone"] += sum(store.record_gone(session, row_id) for row_id in todo.gone)
            pools = {p: session.get_one(Pool, p) for p in todo.resume}
            # a blocked pool gets no new instance, a resumed request neither: given up (the
            # plan asks again after the block if it still wants them)
            blocked = {p: why for p, pool in pools.items()
                       if (why := store.blocked_reason(pool, listed_at))}  # fmt: skip
            for pool_id, why in blocked.items():
                rows = [row for row, _ in todo.resume[pool_id]]
                counts["given_up"] += store.give_up(
                    session, rows, f"not resumed: the pool is blocked ({why})"
                )
        for instance_id in todo.release:
            release_run(d, instance_id)
            counts["released"] += 1
        for pool_id, launch in todo.resume.items():
            if pool_id in blocked:
                continue
            _launch(d, pools[pool_id], list(launch))
            counts["resumed"] += len(launch)
        for pid in todo.orphans:
            try:
                provider.delete_instance(pid)
                counts["orphans"] += 1
            except ProviderError as exc:
                log.warning("orphan %s of %s: %s", pid, prow.name, exc)
    if counts["gone"]:
        d.replan("instance_gone")


# -- Celery --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tasks:
    """The procurement tasks as registered on one Celery app."""

    acquire: Any
    release: Any
    poll_interruptions: Any
    refresh_offers: Any
    reconcile_instances: Any


def register(app: Celery, deps: Callable[[], Deps]) -> Tasks:
    """Register the procurement tasks on `app`, each run with `deps()` (called per run, so
    a composition root may build them lazily, once)."""

    def finish(task: Any, out: Outcome) -> dict[str, Any]:
        out.count("acquire" if task.name == ACQUIRE else "release")
        if out.retry:
            delay = retry_in_s(task.request.retries, random.random(), deps().policy)
            if delay is not None:
                raise task.retry(countdown=delay)
        return out.as_dict()

    db_retries = {
        "autoretry_for": (OperationalError,),
        "retry_backoff": True,
        "retry_jitter": True,
        "max_retries": None,
    }

    @app.task(name=ACQUIRE, bind=True, shared=False, **db_retries)
    def acquire(
        self: Any,
        pool_id: str,
        count: int,
        cluster_id: str | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """`count` instances in the pool. The request id (default: the Celery task id,
        which a retry or redelivery keeps) fixes the idempotency keys."""
        rid = request_id or self.request.id or str(uuid.uuid4())
        return finish(self, acquire_run(deps(), pool_id, count, rid, cluster_id))

    @app.task(name=RELEASE, bind=True, shared=False, **db_retries)
    def release(self: Any, instance_id: str, reason: str | None = None) -> dict[str, Any]:
        return finish(self, release_run(deps(), instance_id, reason))

    @app.task(name=POLL_INTERRUPTIONS, shared=False)
    def poll_interruptions() -> list[str]:
        return poll_interruptions_run(deps())

    @app.task(name=REFRESH_OFFERS, shared=False)
    def refresh_offers() -> int:
        return refresh_offers_run(deps())

    @app.task(name=RECONCILE_INSTANCES, shared=False)
    def reconcile_instances() -> dict[str, int]:
        return reconcile_run(deps())

    return Tasks(acquire, release, poll_interruptions, refresh_offers, reconcile_instances)
