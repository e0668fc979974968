"""The worker's composition root: the Celery app (worker and beat run
`celery -A controlplane.tasks:celery_app`), what its tasks use from the outside world
(settings, database sessions, provider adapters), and the two ways other processes ask
it for work: `request_replan()` and `dispatch_procurement()`.

Tasks are thin: they open a transaction, call a service, and trigger follow-ups.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache

from celery import Celery, Task, signals
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from controlplane.db.session import make_engine, make_session_factory, transaction
from controlplane.liveness import Breaker
from controlplane.procurement import tasks as procurement
from controlplane.procurement.adapters import ProviderCache
from controlplane.procurement.core import Action
from controlplane.procurement.tasks import Deps
from controlplane.services import costs, records, rollouts
from controlplane.services.clusters import update_liveness
from controlplane.services.placement import replan as run_replan
from controlplane.services.spend import limits_from
from controlplane.settings import Settings, db_timeouts, get_settings
from controlplane.webhook import tasks as webhook
from gpufleet_logging import clean_request_id, configure_logging, current_request_id
from gpufleet_logging.context import bind_request_id, unbind_request_id

log = logging.getLogger("gpufleet.tasks")

REPLAN = "gpufleet.replan"
CHECK_CLUSTERS = "gpufleet.check_clusters"
ACCRUE_COSTS = "gpufleet.accrue_costs"
ROLLOUTS = "gpufleet.rollouts"
ROLLOUTS_EVERY_S = 5.0


def _broker() -> str:
    return get_settings().redis_url or "redis://127.0.0.1:6380"


celery_app = Celery("gpufleet", broker=_broker(), backend=_broker())
celery_app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={  # see below the call
        name: {**entry, "options": {"expires": entry["schedule"]}}
        for name, entry in {
            "check-clusters": {"task": CHECK_CLUSTERS, "schedule": 5.0},
            "rollouts": {"task": ROLLOUTS, "schedule": ROLLOUTS_EVERY_S},
            "poll-interruptions": {"task": procurement.POLL_INTERRUPTIONS, "schedule": 0.5},
            "reconcile-instances": {"task": procurement.RECONCILE_INSTANCES, "schedule": 30.0},
            "refresh-offers": {"task": procurement.REFRESH_OFFERS, "schedule": 300.0},
            "replan": {"task": REPLAN, "schedule": 30.0, "kwargs": {"reason": "timer"}},
            "accrue-costs": {"task": ACCRUE_COSTS, "schedule": get_settings().cost_accrue_every_s},
            "export-webhook": {
                "task": webhook.EXPORT_WEBHOOK,
                "schedule": get_settings().events_webhook_every_s,
            },
        }.items()
    },
)
# Each periodic task expires when its next one is due: one the workers could not start in
# time (a slow provider, a busy worker) is dropped, not queued behind the next — while a
# provider answered slowly, 0.5 s polls piled up by the thousand and starved acquires and
# releases. The sweeps also run one at a time (`procurement.tasks.single_flight`).


# Per-task lines ("Task … received", "… succeeded in 0.002s: []") at INFO, for a poll every
# 0.5 s, grew the worker's log by ~50 MB a day saying that nothing happened. Tasks log what
# changed themselves; a task that fails is still logged (ERROR) by celery.app.trace.
PER_TASK_LOGGERS = ("celery.app.trace", "celery.worker.strategy")


@signals.setup_logging.connect
def _configure_logging(loglevel: int | str | None = None, **_: object) -> None:
    """The worker's and beat's logging is ours (a receiver here stops Celery's own): JSON
    lines with the task's request id; `--loglevel` is the default, GPUFLEET_LOG_LEVEL wins."""
    default = logging.getLevelName(loglevel) if isinstance(loglevel, int) else loglevel
    configure_logging("beat" if "beat" in sys.argv else "worker", default_level=default or "INFO")
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# The request id travels with each task sent while one is bound (an API request, or a task
# sending follow-ups) as a message header, and is bound again while the task runs.
REQUEST_ID_HEADER = "gpufleet_request_id"


@signals.before_task_publish.connect
def _carry_request_id(headers: dict[str, object] | None = None, **_: object) -> None:
    rid = current_request_id()
    if rid and headers is not None:
        headers.setdefault(REQUEST_ID_HEADER, rid)


@signals.task_prerun.connect
def _bind_request_id(task: Task, **_: object) -> None:
    raw = task.request.get(REQUEST_ID_HEADER)  # custom headers land on the task's context
    rid = clean_request_id(raw) if isinstance(raw, str) else None
    task.request.gpufleet_bound = bind_request_id(rid)  # (the context is this run's own)


@signals.task_postrun.connect
def _unbind_request_id(task: Task, **_: object) -> None:
    token = task.request.get("gpufleet_bound")
    if token is not None:
        unbind_request_id(token)


TASK_RUNS = Counter(
    "gpufleet_task_runs_total",
    "Celery task runs this worker finished, by task and outcome (success, failure, retry)",
    ["task", "outcome"],
)
TASK_SECONDS = Histogram(
    "gpufleet_task_duration_seconds",
    "How long each Celery task run took, by task",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
REPLAN_UNPLACED = Gauge(
    "gpufleet_replan_unplaced_replicas",
    "Replicas the last re-plan on this worker found no room for (all deployments)",
)
REPLAN_COST = Gauge(
    "gpufleet_replan_cost_dollars_per_hour",
    "What the last re-plan on this worker placed costs per hour",
)
_started: dict[str, float] = {}


@signals.task_prerun.connect
def _task_started(task_id: str | None = None, **_: object) -> None:
    if task_id:
        _started[task_id] = time.perf_counter()


@signals.task_postrun.connect
def _task_finished(
    task_id: str | None = None, task: object = None, state: str | None = None, **_: object
) -> None:
    began = _started.pop(task_id or "", None)
    name = str(getattr(task, "name", "unknown"))
    TASK_RUNS.labels(name, (state or "unknown").lower()).inc()
    if began is not None:
        TASK_SECONDS.labels(name).observe(time.perf_counter() - began)


@signals.worker_ready.connect
def _serve_metrics(**_: object) -> None:
    """`GPUFLEET_WORKER_METRICS_PORT` set (`up` sets it): /metrics on 127.0.0.1 there. The
    worker runs one process (`--pool=solo`), so its default registry is all of it."""
    port = get_settings().worker_metrics_port
    if port:
        start_http_server(port, addr="127.0.0.1")
        log.info("worker metrics on http://127.0.0.1:%d/metrics", port)


def unplaced_replicas(summary: Mapping[str, object]) -> int:
    """Replicas a re-plan's summary found no room for, over every deployment."""
    deployments = summary.get("deployments")
    if not isinstance(deployments, dict):
        return 0
    return sum(
        int(u.get("replicas", 0))
        for d in deployments.values()
        if isinstance(d, dict)
        for u in d.get("unplaced", ())
        if isinstance(u, dict)
    )


def request_replan(reason: str, retry: bool | None = None) -> None:
    """Ask the workers for a re-plan (`retry=False`: fail at once when the broker is down,
    instead of Celery's publish retries)."""
    celery_app.send_task(REPLAN, kwargs={"reason": reason}, retry=retry)


def dispatch_procurement(actions: Iterable[Action]) -> None:
    """Send the tasks that carry a committed plan's procurement actions out."""
    procurement.dispatch(actions, celery_app.send_task)


def ledger_policy(settings: Settings) -> costs.LedgerPolicy:
    """How the cost ledger is kept, from `GPUFLEET_COST_*`."""
    return costs.LedgerPolicy(
        max_gap=timedelta(seconds=settings.cost_accrual_max_gap_s),
        retention=timedelta(days=settings.cost_ledger_retention_days),
    )


@dataclass(frozen=True)
class Worker:
    """What the worker's tasks use from the outside world."""

    settings: Settings
    procurement: Deps  # its session factory is the worker's


def build_worker(settings: Settings) -> Worker:
    factory = make_session_factory(
        make_engine(settings.database_url, pool_size=2, **db_timeouts(settings))
    )
    deps = Deps(factory=factory, providers=ProviderCache(settings.data_dir), replan=request_replan)
    return Worker(settings, deps)


def register(app: Celery, worker: Callable[[], Worker]) -> None:
    """Register every control-plane task on `app`, each run with `worker()` (tests pass
    their own app and worker: a local or moto-backed provider, a manual clock)."""
    procurement.register(app, lambda: worker().procurement)
    webhook.register(app, lambda: worker().procurement.factory, lambda: worker().settings)

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

    @app.task(name=ROLLOUTS, shared=False)
    def step_rollouts() -> dict[str, str]:
        """One look at every running canary (docs/rollouts.md): deployment → the phase its
        rollout moved to. The bus process publishes the clusters it bumped; a rollback put
        the stable revision's spec back, which placement may size differently."""
        w = worker()
        with transaction(w.procurement.factory) as session:
            stale_after = timedelta(seconds=w.settings.cluster_stale_after_s)
            moved = rollouts.tick(session, datetime.now(UTC), stale_after)
        if moved:
            log.info("rollouts moved: %s", ", ".join(f"{d} {p}" for d, p in moved.items()))
        back = sorted(d for d, phase in moved.items() if phase == "rolled_back")
        if back:
            w.procurement.replan(f"rolled back: {', '.join(back)}")
        return moved

    @app.task(name=ACCRUE_COSTS, shared=False)
    def accrue_costs() -> dict[str, object]:
        """Add the time since the last accrual to the cost ledger (docs/cost.md); drop the
        events past their retention (`GPUFLEET_EVENTS_RETENTION_DAYS`)."""
        w = worker()
        now = datetime.now(UTC)
        with transaction(w.procurement.factory) as session:
            done = costs.accrue(session, now, ledger_policy(w.settings))
            retention = timedelta(days=w.settings.events_retention_days)
            dropped = records.drop_old_events(session, now, retention)
        if dropped:
            log.info("dropped %d event(s) older than %s", dropped, retention)
        for pool in done.warned:
            log.warning("reservation %s: expiry warning (see its ReservationExpiring event)", pool)
        return {"rows": done.rows, "cost": round(done.cost, 6), "warned": done.warned}

    @app.task(name=REPLAN, shared=False)
    def replan(reason: str = "timer") -> dict[str, object] | None:
        """Re-plan (one at a time: a Postgres advisory lock), write placements and an event,
        then send the procurement tasks. The bus process publishes the clusters whose
        desired generation moved."""
        with transaction(worker().procurement.factory) as session:
            done = run_replan(  # after the one running, not never
                session, reason, wait_s=30.0, spend_limits=limits_from(worker().settings)
            )
        if done is None:
            log.warning("re-plan skipped (%s): another one held the lock for 30 s", reason)
            return None
        procurement.dispatch(done.actions, app.send_task)  # after the commit, see dispatch
        info = done.summary
        cost, actions = info["total_cost_per_hour"], len(done.actions)
        REPLAN_COST.set(float(cost))
        REPLAN_UNPLACED.set(unplaced_replicas(info))
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
