"""The fleet's state as Prometheus gauges, read from PostgreSQL when ``/metrics`` is scraped.

Every API worker answers the same (the database is the source), so these are never summed
across workers. One read session per scrape: clusters, pools and deployments as the
dashboard's read models give them (``services.fleet_view``). Names follow Prometheus'
rules (base units: seconds, GPUs, dollars per hour); each is listed in docs/observability.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from controlplane.liveness import evidence_horizon
from controlplane.services import cost_report, fleet_view
from controlplane.services.clusters import bus_progress

log = logging.getLogger(__name__)
MAX_DEPLOYMENTS = 100_000
STALE_AFTER = timedelta(seconds=15)  # as liveness: a few seconds between progress writes


class FleetCollector(Collector):
    def __init__(
        self, read_session: Callable[[], Session], now: Callable[[], datetime] | None = None
    ) -> None:
        self.read_session = read_session
        self.now = now or (lambda: datetime.now(UTC))

    def describe(self) -> list[Metric]:
        return []  # no names to check at registration (and no query then)

    def collect(self) -> Iterator[Metric]:
        readable = GaugeMetricFamily(
            "gpufleet_fleet_state_readable",
            "1 when this scrape could read the fleet's state from PostgreSQL; 0: the fleet "
            "gauges are absent (never zeros that would read as an empty fleet)",
        )
        try:
            with self.read_session() as session:
                progress = bus_progress(session)
                clusters = fleet_view.clusters(session)
                pools = fleet_view.pools(session)
                deployments = fleet_view.deployments(session, limit=MAX_DEPLOYMENTS)
                spent = cost_report.last_day(session, self.now())
        except SQLAlchemyError as exc:
            log.warning("fleet metrics: the database did not answer (%s)", type(exc).__name__)
            readable.add_metric([], 0)
            yield readable
            return
        readable.add_metric([], 1)
        yield readable
        now = self.now()
        horizon, _behind = evidence_horizon(now, progress, STALE_AFTER)
        yield from cluster_metrics(clusters, now, horizon)
        yield from pool_metrics(pools)
        yield from deployment_metrics(deployments)
        yield from cost_metrics(spent)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def cluster_metrics(
    clusters: list[fleet_view.ClusterView], now: datetime, horizon: datetime | None = None
) -> Iterator[Metric]:
    """``horizon``: up to when the bus process has read the planes' reports
    (``liveness.evidence_horizon``); a heartbeat's age counts up to it, so a frozen bus
    process pages once (``gpufleet_bus_evidence_lag_seconds``), not once per cluster."""
    horizon = now if horizon is None else horizon
    behind = GaugeMetricFamily(
        "gpufleet_bus_evidence_lag_seconds",
        "How far behind now the control plane has read the planes' reports (0: caught up); "
        "heartbeat ages count only up to there",
    )
    behind.add_metric([], max(0.0, (now - horizon).total_seconds()))
    age = _gauge(
        "gpufleet_cluster_heartbeat_age_seconds",
        "Seconds from the cluster's last heartbeat to what the control plane has read of the "
        "reports (no series before its first)",
        ["cluster"],
    )
    state = _gauge(
        "gpufleet_cluster_state",
        "1 for the cluster's liveness state (pending, healthy, stale, down)",
        ["cluster", "state"],
    )
    lag = _gauge(
        "gpufleet_cluster_generation_lag",
        "Desired-state generations the plane has not applied yet",
        ["cluster"],
    )
    replicas = _gauge(
        "gpufleet_cluster_replicas", "Replicas the plane reports, by state", ["cluster", "state"]
    )
    for c in clusters:
        if c.last_heartbeat_at is not None:
            seen = c.last_heartbeat_at
            seen = seen if seen.tzinfo else seen.replace(tzinfo=UTC)
            age.add_metric([c.name], max(0.0, (horizon - seen).total_seconds()))
        state.add_metric([c.name, c.state], 1)
        lag.add_metric([c.name], max(0, c.desired_generation - c.observed_generation))
        for s, n in sorted(c.replicas.items()):
            replicas.add_metric([c.name, s], n)
    yield from (behind, age, state, lag, replicas)


def pool_metrics(pools: list[fleet_view.PoolView]) -> Iterator[Metric]:
    labels = ["pool", "provider", "region", "gpu_type", "purchase_type"]
    held = _gauge("gpufleet_pool_gpus", "GPUs held (a reservation: its commitment)", labels)
    allocated = _gauge("gpufleet_pool_allocated_gpus", "GPUs the placement uses", labels)
    price = _gauge(
        "gpufleet_pool_price_dollars_per_gpu_hour", "Price of one GPU-hour in the pool", labels
    )
    blocked = _gauge(
        "gpufleet_pool_blocked",
        "1 while procurement gets no instances there, with why (exhausted, quota_exceeded, "
        "failing, outage); 0 with reason none otherwise",
        ["pool", "reason"],
    )
    committed = _gauge(
        "gpufleet_reservation_committed_gpus", "GPUs a reservation commits to", ["pool"]
    )
    term_end = _gauge(
        "gpufleet_reservation_term_end_timestamp_seconds",
        "When a reservation's term ends (Unix time)",
        ["pool"],
    )
    for p in pools:
        values = [p.name, p.provider, p.region, p.gpu_type, p.purchase_type]
        held.add_metric(values, p.held)
        allocated.add_metric(values, p.allocated)
        price.add_metric(values, float(p.price))
        blocked.add_metric([p.name, str(p.blocked or "none")[:32]], 1 if p.blocked else 0)
        if p.purchase_type == "reserved":
            committed.add_metric([p.name], p.committed or p.gpus)
            if p.term_end is not None:
                end = p.term_end if p.term_end.tzinfo else p.term_end.replace(tzinfo=UTC)
                term_end.add_metric([p.name], end.timestamp())
    yield from (held, allocated, price, blocked, committed, term_end)


def deployment_metrics(deployments: list[fleet_view.DeploymentRow]) -> Iterator[Metric]:
    wanted = _gauge(
        "gpufleet_deployment_wanted_replicas", "Replicas the autoscalers want", ["deployment"]
    )
    placed = _gauge(
        "gpufleet_deployment_placed_replicas", "Replicas placement found room for", ["deployment"]
    )
    unplaced = _gauge(
        "gpufleet_deployment_unplaced_replicas",
        "Wanted replicas placement found no room for",
        ["deployment"],
    )
    ready = _gauge(
        "gpufleet_deployment_ready_replicas", "Replicas the planes report ready", ["deployment"]
    )
    cost = _gauge(
        "gpufleet_deployment_cost_dollars_per_hour", "What the placement costs", ["deployment"]
    )
    total = GaugeMetricFamily(
        "gpufleet_fleet_cost_dollars_per_hour", "What every deployment's placement costs"
    )
    spend = 0.0
    for d in deployments:
        wanted.add_metric([d.name], d.wanted)
        placed.add_metric([d.name], d.placed)
        unplaced.add_metric([d.name], max(0, d.wanted - d.placed))
        ready.add_metric([d.name], sum(d.ready.values()))
        cost.add_metric([d.name], float(d.cost_per_hour))
        spend += float(d.cost_per_hour)
    total.add_metric([], spend)
    yield from (wanted, placed, unplaced, ready, cost, total)


HOUR_S = 3600.0


def cost_metrics(day: cost_report.LastDay) -> Iterator[Metric]:
    """The cost ledger's last 24 hours (docs/cost.md, "Metrics")."""
    labels = ["deployment", "cluster", "provider", "pool", "purchase_type"]
    spent = _gauge(
        "gpufleet_cost_last_day_dollars",
        "What the cost ledger charged over the last 24 hours; deployment and cluster "
        "(idle): held GPUs no placement used",
        labels,
    )
    held = _gauge(
        "gpufleet_cost_last_day_held_gpu_seconds", "GPU-seconds paid for, last 24 hours", labels
    )
    used = _gauge(
        "gpufleet_cost_last_day_used_gpu_seconds",
        "GPU-seconds placement used, last 24 hours",
        labels,
    )
    paid_reserved = _gauge(
        "gpufleet_reservation_last_day_paid_gpu_seconds",
        "A reservation's committed GPU-seconds paid over the last 24 hours (the ledger)",
        ["pool"],
    )
    used_reserved = _gauge(
        "gpufleet_reservation_last_day_used_gpu_seconds",
        "A reservation's GPU-seconds placement used over the last 24 hours (the ledger)",
        ["pool"],
    )
    per_mtok = _gauge(
        "gpufleet_deployment_last_day_dollars_per_million_tokens",
        "GPU cost per million tokens (input + output) over the last 24 hours; no series "
        "without tokens",
        ["deployment"],
    )
    tokens = _gauge(
        "gpufleet_deployment_last_day_tokens",
        "Tokens the planes' routers served over the last 24 hours",
        ["deployment", "direction"],
    )
    accrued = GaugeMetricFamily(
        "gpufleet_cost_ledger_accrued_timestamp_seconds",
        "Until when the cost ledger has been accrued (Unix time); no series before the first",
    )
    pools: dict[str, list[float]] = {name: [0.0, 0.0] for name in day.reserved}
    by_deployment: dict[str, float] = {}
    for row in day.rows:
        values = [row.deployment or cost_report.IDLE_NAME, row.cluster or cost_report.IDLE_NAME,
                  row.provider, row.pool, row.purchase_type]  # fmt: skip
        spent.add_metric(values, row.cost)
        held.add_metric(values, row.held_gpu_hours * HOUR_S)
        used.add_metric(values, row.used_gpu_hours * HOUR_S)
        if row.pool in pools:
            pools[row.pool][0] += row.held_gpu_hours * HOUR_S
            pools[row.pool][1] += row.used_gpu_hours * HOUR_S
        if row.deployment:
            by_deployment[row.deployment] = by_deployment.get(row.deployment, 0.0) + row.cost
    for name, (paid, use) in pools.items():
        paid_reserved.add_metric([name], paid)
        used_reserved.add_metric([name], use)
    for name, (inp, out) in sorted(day.tokens.items()):
        tokens.add_metric([name, "input"], inp)
        tokens.add_metric([name, "output"], out)
        if inp + out:
            per_mtok.add_metric([name], by_deployment.get(name, 0.0) / (inp + out) * 1e6)
    if day.accrued_until is not None:
        accrued.add_metric([], day.accrued_until.timestamp())
    yield from (spent, held, used, paid_reserved, used_reserved, per_mtok, tokens, accrued)
