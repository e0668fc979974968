"""`GET /costs`: the ledger over a window, grouped, with reservations' burn-down, $/Mtok
against public API prices and the TCO lines, as the API's JSON. The ledger is summed in SQL
over the window by every dimension (and once more by day for the chart); each view adds up
what it needs from those rows with `controlplane.costs`'s arithmetic.

A window is read in whole UTC hours: `from` rounded down, `to` rounded up (the ledger's rows
are hours).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane import costs
from controlplane.db import models as m
from controlplane.errors import InvalidSpec
from controlplane.placement import Assignment
from controlplane.services.placement import load_world, place

IDLE_NAME = "(idle)"
"""How a group of held GPUs no placement uses is named (no object can have this name)."""
OTHER_NAME = "(other)"
DEFAULT_WINDOW = timedelta(days=7)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)
GROUP_BY = {g: g for g in costs.GROUPS} | {"purchase-type": "purchase_type"}


@dataclass(frozen=True)
class Query:
    start: datetime
    end: datetime
    group_by: str
    limit: int


def _time(value: str, name: str) -> datetime:
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):  # 0001-01-01T00:00+01:00 overflowed to UTC: a 500
        raise InvalidSpec.on(
            name, f"'{value[:40]}' is not a time; use ISO 8601, e.g. 2026-01-31T12:00:00Z"
        ) from None
    if not EARLIEST <= at <= LATEST:
        raise InvalidSpec.on(name, f"must be between {EARLIEST.year} and {LATEST.year - 1}")
    return at


def parse_query(
    start: str | None,
    end: str | None,
    group_by: str | None,
    limit: int,
    now: datetime,
    max_window: timedelta,
) -> Query:
    """The window and grouping asked for; `InvalidSpec` naming the parameter otherwise.
    Defaults: the week up to now, grouped by deployment."""
    stop = _time(end, "to") if end else now
    begin = _time(start, "from") if start else stop - DEFAULT_WINDOW
    if stop <= begin:
        raise InvalidSpec.on(
            "to", f"must be after from ({begin.isoformat()}); swap them or widen the window"
        )
    if stop - begin > max_window:
        raise InvalidSpec.on(
            "from",
            f"the window is {(stop - begin).days} days, longer than {max_window.days} "
            "(GPUFLEET_COST_WINDOW_MAX_DAYS); ask for a shorter one",
        )
    key = (group_by or "deployment").strip().lower()
    if key not in GROUP_BY:
        raise InvalidSpec.on(
            "group_by",
            f"'{(group_by or '')[:40]}' is not a grouping; use one of " + ", ".join(costs.GROUPS),
        )
    if not 1 <= limit <= 500:
        raise InvalidSpec.on("limit", "must be 1–500 (groups beyond it are summed as (other))")
    return Query(begin, stop, GROUP_BY[key], limit)


def _hours(q: Query) -> tuple[datetime, datetime]:
    start = costs.floor_hour(q.start)
    end = costs.floor_hour(q.end)
    return start, end if end == q.end else end + costs.HOUR


_DIMS = ("pool", "deployment", "cluster", "provider", "purchase_type")


def _rows(session: Session, q: Query, dims: Sequence[str], by_day: bool) -> list[costs.LedgerRow]:
    """Ledger sums over the window by `dims` (and UTC day), as `LedgerRow`s whose other
    dimensions are empty."""
    start, end = _hours(q)
    ledger = m.CostLedger
    day = func.date_trunc("day", ledger.hour, "UTC") if by_day else func.min(ledger.hour)
    columns = [getattr(ledger, d) for d in dims]
    stmt = (
        select(day, *columns, func.sum(ledger.held_gpu_hours), func.sum(ledger.used_gpu_hours), func.sum(ledger.cost))
        .where(ledger.hour >= start, ledger.hour < end)
        .group_by(*([day] if by_day else []), *columns)
    )  # fmt: skip
    out = []
    for hour, *values in session.execute(stmt).all():
        named = dict(zip(dims, values[: len(dims)], strict=True))
        held, used, cost = values[len(dims) :]
        out.append(
            costs.LedgerRow(
                hour=hour,
                **{d: named.get(d, "") for d in _DIMS},
                held_gpu_hours=float(held or 0),
                used_gpu_hours=float(used or 0),
                cost=float(cost or 0),
            )
        )
    return out


def _name(value: str) -> str:
    return value or IDLE_NAME


def _money(value: float) -> float:
    return round(value, 6)


def _totals(name: str, t: costs.Totals, whole: float) -> dict[str, Any]:
    return {
        "name": name,
        "cost": _money(t.cost),
        "share": round(t.cost / whole, 6) if whole else 0.0,
        "held_gpu_hours": _money(t.held_gpu_hours),
        "used_gpu_hours": _money(t.used_gpu_hours),
        "idle_gpu_hours": _money(t.idle_gpu_hours),
    }


def _groups(rows: Sequence[costs.LedgerRow], q: Query) -> tuple[dict[str, Any], list[Any]]:
    total = costs.Totals()
    for row in rows:
        total.add(row)
    by = list(costs.grouped(rows, q.group_by).items())
    shown, rest = by[: q.limit], by[q.limit :]
    groups = [_totals(_name(k), t, total.cost) for k, t in shown]
    if rest:
        other = costs.Totals()
        for _, t in rest:
            other.add(t)
        groups.append(_totals(OTHER_NAME, other, total.cost))
    return _totals("total", total, total.cost), groups


def _daily(rows: Iterable[costs.LedgerRow], q: Query, names: set[str]) -> list[dict[str, Any]]:
    out = []
    for day, values in costs.daily(rows, q.group_by).items():
        merged: dict[str, float] = {}
        for k, v in values.items():
            key = _name(k) if _name(k) in names else OTHER_NAME
            merged[key] = merged.get(key, 0.0) + v
        out.append({"day": day, "costs": {k: _money(v) for k, v in sorted(merged.items())}})
    return out


def _reservations(
    session: Session, rows: Sequence[costs.LedgerRow], now: datetime
) -> list[dict[str, Any]]:
    out = []
    pools = session.scalars(
        select(m.Pool).where(m.Pool.purchase_type == "reserved").order_by(m.Pool.name)
    ).unique()
    for pool in pools:
        r = costs.Reservation(
            pool.name,
            pool.committed_gpus or pool.gpus,
            float(pool.price_per_gpu_hour),
            pool.term_start,
            pool.term_end,
        )
        b = costs.burn_down(r, rows, now)
        out.append(
            {
                "pool": pool.name,
                "committed_gpus": b.committed_gpus,
                "price_per_gpu_hour": r.price_per_gpu_hour,
                "term_start": pool.term_start.isoformat() if pool.term_start else None,
                "term_end": pool.term_end.isoformat() if pool.term_end else None,
                "term_gpu_hours": b.committed_gpu_hours,
                "burned_gpu_hours": b.burned_gpu_hours,
                "remaining_hours": b.remaining_hours,
                "paid_gpu_hours": _money(b.paid_gpu_hours),
                "used_gpu_hours": _money(b.used_gpu_hours),
                "idle_gpu_hours": _money(b.idle_gpu_hours),
                "idle_fraction": None if b.idle_fraction is None else round(b.idle_fraction, 6),
                "idle_cost": _money(b.idle_cost),
                "expiry_warning_days": b.expiry_warning_days,
            }
        )
    return out


def usage(session: Session, q: Query) -> tuple[dict[str, tuple[int, int]], int, int]:
    """Tokens (input, output) per deployment over the window, response bytes in all, and of
    those the bytes sent on to clients in another region."""
    start, end = _hours(q)
    usage_rows = m.TokenUsage
    stmt = (
        select(usage_rows.deployment, func.sum(usage_rows.input_tokens), func.sum(usage_rows.output_tokens),
               func.sum(usage_rows.response_bytes), func.sum(usage_rows.cross_region_bytes))
        .where(usage_rows.hour >= start, usage_rows.hour < end)
        .group_by(usage_rows.deployment)
    )  # fmt: skip
    tokens, size, crossed = {}, 0, 0
    for name, inp, out, served, cross in session.execute(stmt).all():
        tokens[name] = (int(inp or 0), int(out or 0))
        size += int(served or 0)
        crossed += int(cross or 0)
    return tokens, size, crossed


def api_prices(session: Session) -> list[costs.ApiPrice]:
    return [
        costs.ApiPrice(
            p.name,
            p.model_id,
            float(p.input_price_per_mtok),
            float(p.output_price_per_mtok),
            p.source or "",
        )
        for p in session.scalars(select(m.ApiPrice).order_by(m.ApiPrice.name))
    ]


def _tokens(
    session: Session, rows: Sequence[costs.LedgerRow], tokens: dict[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    cost = {k: t.cost for k, t in costs.grouped(rows, "deployment").items() if k}
    models = {
        n: mid for n, mid in session.execute(select(m.Deployment.name, m.Deployment.model_id))
    }
    prices = api_prices(session)
    out = []
    for name in sorted(set(cost) | set(tokens)):
        inp, outp = tokens.get(name, (0, 0))
        t = costs.token_cost(name, models.get(name, ""), cost.get(name, 0.0), inp, outp, prices)
        out.append(
            {
                "deployment": name,
                "model_id": t.model_id,
                "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens,
                "cost": _money(t.cost),
                "dollars_per_mtok": None if t.dollars_per_mtok is None else _money(t.dollars_per_mtok),
                "api_prices": [
                    {
                        "name": c.price.name,
                        "source": c.price.source,
                        "input_price_per_mtok": c.price.input_per_mtok,
                        "output_price_per_mtok": c.price.output_per_mtok,
                        "api_cost": _money(c.api_cost),
                        "saving": _money(c.saving(t.cost)),
                        "break_even_tokens": None if c.break_even_tokens is None else round(c.break_even_tokens),
                    }
                    for c in t.comparisons
                ],
            }
        )  # fmt: skip
    return out


def rebalance(session: Session, now: datetime) -> costs.Rebalance:
    """What the placement would save by moving work onto idle reservations: the engine run
    afresh on today's fleet without keeping any replica where it is (no churn), next to the
    placement as it stands. Reserved GPUs are paid used or not, so the saving is the
    on-demand and spot GPU-hours the fresh placement no longer needs."""
    world = load_world(session, now)
    inp = world.input
    fresh = place(world, replace(inp, current=()))
    size = {d.name: d.gpus_per_replica for d in inp.deployments}
    pools = {
        p.id: costs.PoolPrice(p.purchase, p.price_per_gpu_hour, p.capacity_gpus) for p in inp.pools
    }

    def gpus(placed: Iterable[Assignment]) -> list[tuple[str, int]]:
        return [(a.pool, a.replicas * size.get(_active(a.deployment), 0)) for a in placed]

    def rows(placed: Iterable[Assignment]) -> list[tuple[str, str, int]]:
        return [(a.deployment, a.pool, a.replicas) for a in placed]

    placed_now: dict[str, int] = {}
    for a in world.placed:
        placed_now[_active(a.deployment)] = placed_now.get(_active(a.deployment), 0) + a.replicas
    return costs.Rebalance(
        now=costs.spend(gpus(world.placed), pools),
        fresh=costs.spend(gpus(fresh.assignments), pools),
        moved_replicas=costs.moved_replicas(rows(world.placed), rows(fresh.assignments)),
        unplaced_replicas_now=sum(
            max(0, d.target_replicas - placed_now.get(d.name, 0)) for d in inp.deployments
        ),
        unplaced_replicas_fresh=sum(u.replicas for u in fresh.unplaced),
    )


def _active(deployment: str) -> str:
    """A standby's assignment (``<name>/standby``) counts as its deployment's size."""
    return deployment.removesuffix("/standby")


def _rebalance_json(r: costs.Rebalance) -> dict[str, Any]:
    return {
        "saving_per_hour": _money(r.saving_per_hour),
        "on_demand_and_spot_per_hour_now": _money(r.now.marginal_per_hour),
        "on_demand_and_spot_per_hour_fresh": _money(r.fresh.marginal_per_hour),
        "reserved_idle_gpus_now": r.now.reserved_idle_gpus,
        "reserved_idle_gpus_fresh": r.fresh.reserved_idle_gpus,
        "moved_replicas": r.moved_replicas,
        "unplaced_replicas_now": r.unplaced_replicas_now,
        "unplaced_replicas_fresh": r.unplaced_replicas_fresh,
    }


def report(session: Session, q: Query, now: datetime, rates: costs.CostRates) -> dict[str, Any]:
    """The whole answer of `GET /costs` for `q`."""
    rows = _rows(session, q, _DIMS, by_day=False)  # one query; each view sums what it needs
    total, groups = _groups(rows, q)
    names = {g["name"] for g in groups}
    tokens, served, crossed = usage(session, q)
    t = costs.tco(rows, served, rates, q.start, q.end, crossed)
    return {
        "from": q.start.isoformat(),
        "to": q.end.isoformat(),
        "group_by": q.group_by,
        "total": total,
        "groups": groups,
        "daily": _daily(_rows(session, q, [q.group_by], by_day=True), q, names),
        "reservations": _reservations(session, rows, now),
        "rebalance": _rebalance_json(rebalance(session, now)),
        "tokens": _tokens(session, rows, tokens),
        "tco": {
            "gpu": {k: _money(v) for k, v in t.gpu_by_purchase_type.items()},
            "lines": [{"name": x.name, "cost": _money(x.cost), "note": x.note} for x in t.lines],
            "total": _money(t.total),
        },
    }


# --- the last day, for /metrics (api.fleetmetrics) ------------------------------------------

LAST_DAY = timedelta(days=1)


@dataclass(frozen=True)
class LastDay:
    """The ledger's last 24 hours (whole hours: up to 25) for the Prometheus gauges."""

    rows: list[costs.LedgerRow]
    """Sums by deployment, cluster, provider, pool and purchase type."""
    tokens: dict[str, tuple[int, int]]
    reserved: list[str]
    accrued_until: datetime | None


def last_day(session: Session, now: datetime) -> LastDay:
    q = Query(now - LAST_DAY, now, "deployment", 1)
    accrued = session.scalar(select(m.CostAccrual.accrued_until).where(m.CostAccrual.id == 1))
    reserved = session.scalars(
        select(m.Pool.name).where(m.Pool.purchase_type == "reserved").order_by(m.Pool.name)
    )
    return LastDay(_rows(session, q, _DIMS, by_day=False), usage(session, q)[0], list(reserved),
                   accrued)  # fmt: skip
