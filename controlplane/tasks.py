"""The worker's composition root: the Celery app (worker and beat run
`celery -A controlplane.tasks:celery_app`), what its tasks use from the outside world
(settings, database sessions, provider adapters), and the two ways other processes ask
it for work: `request_replan()` and `dispatch_procurement()`.

Tasks are thin: they open a transaction, call a service, and trigger follow-ups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache

from celery import Celery, signals

from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.liveness import Breaker
from controlplane.procurement import tasks as procurement
from controlplane.procurement.adapters import ProviderCache
from controlplane.procurement.core import Action
from controlplane.procurement.tasks import Deps
from controlplane.services.clusters import update_liveness
from controlplane.services.placement import replan as run_replan
from controlplane.settings import Settings, get_settings
from controlplane.spend import SpendLimits

log = logging.getLogger("gpufleet.tasks")

REPLAN = "gpufleet.replan"
CHECK_CLUSTERS = "gpufleet.check_clusters"


def _broker() -> str:
    return get_settings().redis_url or "redis://127.0.0.1:6380"


celery_app = Celery("gpufleet", broker=_broker(), backend=_broker())
celery_app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "check-clusters": {"task": CHECK_CLUSTERS, "schedule": 5.0},
        "poll-interruptions": {"task": procurement.POLL_INTERRUPTIONS, "schedule": 0.5},
        "reconcile-instances": {"task": procurement.RECONCILE_INSTANCES, "schedule": 30.0},
        "refresh-offers": {"task": procurement.REFRESH_OFFERS, "schedule": 300.0},
        "replan": {"task": REPLAN, "schedule": 30.0, "kwargs": {"reason": "timer"}},
    },
)


# Per-task lines ("Task … received", "… succeeded in 0.002s: []") at INFO, for a poll every
# 0.5 s, grew the worker's log by ~50 MB a day saying that nothing happened. Tasks log what
# changed themselves; a task that fails is still logged (ERROR) by celery.app.trace.
PER_TASK_LOGGERS = ("celery.app.trace", "celery.worker.strategy")


@signals.after_setup_logger.connect
def _log_changes_not_runs(**_: object) -> None:
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def request_replan(reason: str, retry: bool | None = None) -> None:
    """Ask the workers for a re-plan (`retry=False`: fail at once when the broker is down,
    instead of Celery's publish retries)."""
    celery_app.send_task(REPLAN, kwargs={"reason": reason}, retry=retry)


def dispatch_procurement(actions: Iterable[Action]) -> None:
    """Send the tasks that carry a committed plan's procurement actions out."""
    procurement.dispatch(actions, celery_app.send_task)


def spend_limits(settings: Settings) -> SpendLimits:
    """The spend guard's bounds from `GPUFLEET_SPEND_GUARD_*`."""
    return SpendLimits(
        window=timedelta(seconds=settings.spend_guard_window_s),
        gpus_per_deployment=settings.spend_guard_gpus_per_deployment,
        cost_per_deployment=settings.spend_guard_cost_per_deployment,
        fleet_cost=settings.spend_guard_fleet_cost,
    )


@dataclass(frozen=True)
class Worker:
    """What the worker's tasks use from the outside world."""

    settings: Settings
    procurement: Deps  # its session factory is the worker's


def build_worker(settings: Settings) -> Worker:
    factory = make_session_factory(make_engine(settings.database_url, pool_size=2))
    deps = Deps(factory=factory, providers=ProviderCache(settings.data_dir), replan=request_replan)
    return Worker(settings, deps)


def register(app: Celery, worker: Callable[[], Worker]) -> None:
    """Register every control-plane task on `app`, each run with `worker()` (tests pass
    their own app and worker: a local or moto-backed provider, a manual clock)."""
    procurement.register(app, lambda: worker().procurement)

    @app.task(name=CHECK_CLUSTERS, shared=False)
    def check_clusters() -> list[str]:
        """Mark clusters stale/down after missed heartbeats; re-plan when one went down."""
        w = worker()
        with transaction(w.procurement.factory) as session:
            down = update_liveness(
                session,
                datetime.now(UTC),
                timedelta(seconds=w.settings.cluster_stale_after_s),
                timedelta(seconds=w.settings.cluster_down_after_s),
                Breaker(
                    w.settings.liveness_breaker_fraction, w.settings.liveness_breaker_min_clusters
                ),
            )
        if down:
            log.warning("clusters down: %s", ", ".join(down))
            w.procurement.replan(f"cluster down: {', '.join(down)}")
        return down

    @app.task(name=REPLAN, shared=False)
    def replan(reason: str = "timer") -> dict[str, object] | None:
        """Re-plan (one at a time: a Postgres advisory lock), write placements and an event,
        then send the procurement tasks. The bus process publishes the clusters whose
        desired generation moved."""
        with transaction(worker().procurement.factory) as session:
            done = run_replan(  # after the one running, not never
                session, reason, wait_s=30.0, spend_limits=spend_limits(worker().settings)
            )
        if done is None:
            log.warning("re-plan skipped (%s): another one held the lock for 30 s", reason)
            return None
        procurement.dispatch(done.actions, app.send_task)  # after the commit, see dispatch
        info = done.summary
        cost, actions = info["total_cost_per_hour"], len(done.actions)
        changed = bool(info["changes"]) or actions > 0  # a re-plan that moved nothing: DEBUG
        log.log(
            logging.INFO if changed else logging.DEBUG,
            "re-planned (%s): total $%s/h, %d change(s), %d procurement action(s)",
            reason,
            cost,
            len(info["changes"]),
            actions,
        )
        return {
            "total_cost_per_hour": cost,
            "changes": len(info["changes"]),
            "procurement": actions,
        }


@cache
def _worker() -> Worker:
    return build_worker(get_settings())


register(celery_app, _worker)
