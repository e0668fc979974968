"""Celery app and tasks of the control plane (worker and beat use this module).

Tasks are thin: they open a transaction, call a service, and trigger follow-ups.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from functools import cache

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.settings import get_settings

log = logging.getLogger("gpufleet.tasks")


def _broker() -> str:
    return get_settings().redis_url or "redis://127.0.0.1:6380"


celery_app = Celery("gpufleet", broker=_broker(), backend=_broker())
celery_app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "check-clusters": {"task": "gpufleet.check_clusters", "schedule": 5.0},
        "poll-interruptions": {"task": "gpufleet.poll_interruptions", "schedule": 0.5},
        "reconcile-instances": {"task": "gpufleet.reconcile_instances", "schedule": 30.0},
        "refresh-offers": {"task": "gpufleet.refresh_offers", "schedule": 300.0},
        "replan": {"task": "gpufleet.replan", "schedule": 30.0, "kwargs": {"reason": "timer"}},
    },
)


@cache
def sessions() -> sessionmaker[Session]:
    return make_session_factory(make_engine(get_settings().database_url, pool_size=2))


@celery_app.task(name="gpufleet.check_clusters")
def check_clusters() -> list[str]:
    """Mark clusters stale/down after missed heartbeats; re-plan when one went down."""
    from controlplane.services.clusters import update_liveness

    settings = get_settings()
    with transaction(sessions()) as session:
        down = update_liveness(
            session,
            datetime.now(UTC),
            timedelta(seconds=settings.cluster_stale_after_s),
            timedelta(seconds=settings.cluster_down_after_s),
        )
    if down:
        log.warning("clusters down: %s", ", ".join(down))
        replan.delay(reason=f"cluster down: {', '.join(down)}")
    return down


@celery_app.task(name="gpufleet.replan")
def replan(reason: str = "timer") -> dict[str, object] | None:
    """Re-plan (one at a time: a Postgres advisory lock), write placements and an event.

    The bus process publishes the clusters whose desired generation moved.
    """
    from controlplane.procurement_tasks import dispatch
    from controlplane.services.placement import replan as run_replan

    with transaction(sessions()) as session:
        done = run_replan(session, reason, wait_s=30.0)  # plan after the one running, not never
    if done is None:
        log.warning("re-plan skipped (%s): another one held the lock for 30 s", reason)
        return None
    dispatch(done.actions)  # after the commit: the acquire tasks read the requested rows
    info = done.summary
    log.info("re-planned (%s): total $%s/h, %d procurement action(s)", reason,
             info["total_cost_per_hour"], len(done.actions))  # fmt: skip
    return {"total_cost_per_hour": info["total_cost_per_hour"], "changes": len(info["changes"]),
            "procurement": len(done.actions)}  # fmt: skip


from controlplane import procurement_tasks  # noqa: E402, F401  (registers acquire/release/sweeps)
