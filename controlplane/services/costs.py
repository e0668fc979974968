"""The cost ledger against the database: accrue it from pools, instances and placements,
record the tokens the planes' routers report, warn about reservations that end, and apply
the retention policy. The arithmetic is `controlplane.costs`'s; this module loads and writes.

`accrue` runs in the worker every `GPUFLEET_COST_ACCRUE_EVERY_S` (Celery beat). It locks the
one `cost_accrual` row, so two workers never count an interval twice, and each run charges
[accrued_until, now) at the fleet as it stands now (docs/cost.md, "The ledger").
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from controlplane import costs
from controlplane import placement as engine
from controlplane import rollouts as canary
from controlplane.contracts import DeploymentObserved
from controlplane.db import models as m
from controlplane.procurement.core import HELD
from controlplane.services.lanes import running_canaries
from controlplane.services.placement import held_gpus as instance_gpus
from controlplane.services.reservations import reservations
from controlplane.services.shadows import shadow_of

log = logging.getLogger("gpufleet.costs")
EXPIRING = "ReservationExpiring"


@dataclass(frozen=True)
class LedgerPolicy:
    """How the ledger is kept (settings `GPUFLEET_COST_*`)."""

    max_gap: timedelta = timedelta(hours=1)
    retention: timedelta = timedelta(days=400)


@dataclass(frozen=True)
class Accrued:
    start: datetime
    end: datetime
    rows: int
    cost: float
    left_out: timedelta
    warned: list[str]


def holdings(session: Session, now: datetime) -> list[costs.PoolHolding]:
    """Every pool as it stands at `now`: GPUs paid for and GPUs placed per (deployment,
    cluster)."""
    placed: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)
    rows = session.execute(
        select(m.Placement.replicas, m.Deployment.name, m.Cluster.name, m.Pool.name)
        .join(m.Deployment, m.Deployment.id == m.Placement.deployment_id)
        .join(m.Cluster, m.Cluster.id == m.Placement.cluster_id)
        .join(m.Pool, m.Pool.id == m.Placement.pool_id)
    ).all()
    deployments = {d.name: d for d in session.scalars(select(m.Deployment))}
    per_replica = {name: d.gpus_per_replica for name, d in deployments.items()}
    stored = [engine.Assignment(d, c, p, int(n)) for n, d, c, p in rows if n]
    # what rollouts and shadows run beyond the placed replicas is the deployment's too: it
    # went to the pool's idle row (or, under the larger-of rule, was not charged at all)
    extra = reservations(
        stored,
        per_replica,
        running_canaries(session, deployments.values()),
        {n: s for n, d in deployments.items() if (s := shadow_of(d)) is not None},
    )
    for pool, deployment, cluster, gpus in [
        *(
            (a.pool, a.deployment, a.cluster, a.replicas * per_replica[a.deployment])
            for a in stored
        ),
        *((r.pool, r.deployment, r.cluster, r.gpus) for r in extra),
    ]:
        used = placed[pool]
        used[deployment, cluster] = used.get((deployment, cluster), 0) + gpus
    # billed while draining or releasing too (a pool in outage drains for as long as it
    # lasts; a delete the provider keeps refusing stays releasing): placement's count is not
    instances = instance_gpus(session, HELD)
    out = []
    for pool in session.scalars(select(m.Pool).order_by(m.Pool.name)).unique():
        held = costs.held_gpus(
            pool.purchase_type,
            pool.gpus,
            instances.get(pool.id, 0),
            pool.committed_gpus,
            (pool.term_start, pool.term_end),
            now,
        )
        out.append(
            costs.PoolHolding(
                pool=pool.name,
                provider=pool.provider.name,
                region=pool.region.name,
                gpu_type=pool.gpu_type.name,
                purchase_type=pool.purchase_type,
                price_per_gpu_hour=float(pool.price_per_gpu_hour),
                held_gpus=held,
                used=placed.get(pool.name, {}),
            )
        )
    return out


def _dec(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(Decimal("0.000000001"))


def write_accruals(session: Session, accruals: Sequence[costs.Accrual]) -> None:
    """Add each accrual to its ledger row (created when new)."""
    if not accruals:
        return
    values = [
        {
            "hour": a.key.hour,
            "pool": a.key.pool,
            "deployment": a.key.deployment,
            "cluster": a.key.cluster,
            "provider": a.provider,
            "region": a.region,
            "gpu_type": a.gpu_type,
            "purchase_type": a.purchase_type,
            "price_per_gpu_hour": _dec(a.cost / a.held_gpu_hours if a.held_gpu_hours else 0.0),
            "held_gpu_hours": _dec(a.held_gpu_hours),
            "used_gpu_hours": _dec(a.used_gpu_hours),
            "cost": _dec(a.cost),
        }
        for a in accruals
    ]
    for at in range(0, len(values), WRITE_CHUNK):  # libpq takes at most 65,535 parameters
        _write_chunk(session, values[at : at + WRITE_CHUNK])


WRITE_CHUNK = 1000
"""Ledger rows per statement: 12 parameters each. One statement of them all failed past
~5,400 rows (a big fleet's tick across an hour), and every retry crossed the hour again."""


def _write_chunk(session: Session, values: list[dict[str, Any]]) -> None:
    table = m.CostLedger
    stmt = insert(table).values(values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["hour", "pool", "deployment", "cluster"],
        set_={
            "held_gpu_hours": table.held_gpu_hours + stmt.excluded.held_gpu_hours,
            "used_gpu_hours": table.used_gpu_hours + stmt.excluded.used_gpu_hours,
            "cost": table.cost + stmt.excluded.cost,
            "price_per_gpu_hour": stmt.excluded.price_per_gpu_hour,
            "provider": stmt.excluded.provider,
            "region": stmt.excluded.region,
            "gpu_type": stmt.excluded.gpu_type,
            "purchase_type": stmt.excluded.purchase_type,
        },
    )
    session.execute(stmt)


def accrue(session: Session, now: datetime, policy: LedgerPolicy) -> Accrued:
    """Charge the ledger up to `now`, warn about ending reservations, drop rows past the
    retention. The caller owns the transaction (the lock is held until it commits)."""
    state = session.scalars(select(m.CostAccrual).with_for_update()).first()
    if state is None:
        session.execute(
            insert(m.CostAccrual).values(id=1, accrued_until=now).on_conflict_do_nothing()
        )
        state = session.scalars(select(m.CostAccrual).with_for_update()).one()
        previous = None
    else:
        previous = state.accrued_until
    start, end, left_out = costs.accrual_window(previous, now, policy.max_gap)
    if left_out:
        log.warning(
            "cost ledger: %s without an accrual (the worker was down?); charged the last %s "
            "at the fleet as it stands now, left %s out",
            now - previous if previous else left_out,
            policy.max_gap,
            left_out,
        )
    accruals = costs.accrue(holdings(session, now), start, end) if end > start else []
    write_accruals(session, accruals)
    state.accrued_until = max(end, state.accrued_until)
    warned = warn_expiring(session, now)
    drop_expired(session, now, policy.retention)
    return Accrued(start, end, len(accruals), sum(a.cost for a in accruals), left_out, warned)


def drop_expired(session: Session, now: datetime, retention: timedelta) -> None:
    """The retention policy: ledger and token rows older than `retention` go."""
    cutoff = costs.floor_hour(now - retention)
    session.execute(delete(m.CostLedger).where(m.CostLedger.hour < cutoff))
    session.execute(delete(m.TokenUsage).where(m.TokenUsage.hour < cutoff))


def warn_expiring(session: Session, now: datetime) -> list[str]:
    """A `ReservationExpiring` event per reservation the first time its term has fewer than
    30, 7 or 1 day(s) left (and once when it has ended); returns the pools warned now."""
    warned = []
    pools = session.scalars(select(m.Pool).where(m.Pool.purchase_type == "reserved")).unique()
    for pool in pools:
        days = costs.expiry_warning(pool.term_end, now)
        if days is None or pool.term_end is None:
            continue
        end = pool.term_end.isoformat()
        told = session.scalars(
            select(m.Event.id).where(
                m.Event.type == EXPIRING,
                m.Event.object_kind == "Pool",  # the (object_kind, object_id) index: no scan
                m.Event.object_id == pool.id,
                m.Event.data["days"].as_integer() == days,
                m.Event.data["term_end"].astext == end,
            )
        ).first()
        if told is not None:
            continue
        when = "has ended" if days == 0 else f"ends in under {days} day{'s' if days > 1 else ''}"
        session.add(
            m.Event(
                time=now,
                type=EXPIRING,
                object_kind="Pool",
                object_id=pool.id,
                object_name=pool.name,
                message=f"reservation {pool.name} {when} ({end}): renew it, or plan where its "
                f"{pool.committed_gpus or pool.gpus} GPU(s) of work go",
                data={"days": days, "term_end": end, "committed_gpus": pool.committed_gpus},
            )
        )
        warned.append(pool.name)
    return warned


# --- tokens ---------------------------------------------------------------------------------


USAGE_FIRST_WINDOW = timedelta(hours=1)
"""How long a router may have counted before its first report that is recorded (a new
control plane, or a deployment new on the plane)."""


@dataclass(frozen=True)
class UsageRates:
    """The most one deployment's router on one plane may report per second since its last
    recorded report: the counts a report may add are at most these × the seconds between
    (at least 1). A bound per report instead would cut a long outage's honest counts."""

    tokens_per_s: int = 10_000_000
    bytes_per_s: int = 2_000_000_000

    def bounds(self, elapsed: timedelta) -> tuple[int, int]:
        seconds = max(1.0, elapsed.total_seconds())
        return int(self.tokens_per_s * seconds), int(self.bytes_per_s * seconds)


def record_usage(
    session: Session,
    cluster: str,
    deployments: Iterable[DeploymentObserved],
    at: datetime,
    rates: UsageRates,
) -> None:
    """Add what each deployment's router counters grew by since the cluster's last report
    to the hour of `at`. `deployments`: the report as it may count (`controlplane.trust`)."""
    for d in deployments:
        if d.usage is None:
            continue
        u = d.usage
        current = costs.Counters(
            u.since, u.input_tokens, u.output_tokens, u.response_bytes, u.cross_region_bytes
        )
        row = session.get(m.TokenCounter, (cluster, d.name), with_for_update=True)
        previous = (
            None
            if row is None
            else costs.Counters(
                row.since,
                row.input_tokens,
                row.output_tokens,
                row.response_bytes,
                row.cross_region_bytes,
            )
        )
        elapsed = USAGE_FIRST_WINDOW if row is None else at - row.updated_at
        new = costs.counted(previous, current, *rates.bounds(elapsed))
        if row is None:
            row = m.TokenCounter(cluster=cluster, deployment=d.name)
            session.add(row)
        row.updated_at = at
        row.since, row.input_tokens = current.since, current.input_tokens
        row.output_tokens, row.response_bytes = current.output_tokens, current.response_bytes
        row.cross_region_bytes = current.cross_region_bytes
        if new.input_tokens or new.output_tokens or new.response_bytes:
            lane = canary.lane_of(d.name)  # a rollout lane's tokens are its deployment's
            _add_usage(session, costs.floor_hour(at), lane[0] if lane else d.name, cluster, new)


def _add_usage(
    session: Session, hour: datetime, deployment: str, cluster: str, new: costs.Counters
) -> None:
    table = m.TokenUsage
    stmt = insert(table).values(
        hour=hour,
        deployment=deployment,
        cluster=cluster,
        input_tokens=new.input_tokens,
        output_tokens=new.output_tokens,
        response_bytes=new.response_bytes,
        cross_region_bytes=new.cross_region_bytes,
    )
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["hour", "deployment", "cluster"],
            set_={
                "input_tokens": table.input_tokens + stmt.excluded.input_tokens,
                "output_tokens": table.output_tokens + stmt.excluded.output_tokens,
                "response_bytes": table.response_bytes + stmt.excluded.response_bytes,
                "cross_region_bytes": table.cross_region_bytes + stmt.excluded.cross_region_bytes,
            },
        )
    )
