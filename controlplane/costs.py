"""The cost arithmetic: ledger accrual, reservation burn-down and expiry, $/Mtok and the
break-even against public API prices, and the TCO lines of a window. Pure, no I/O; the
clock is passed in. docs/cost.md says how each figure is computed.

Accrual: between two accruals the fleet is taken as it is at the later one (the task runs
every minute). Each pool pays for `max(held, used)` GPUs at its price: the GPUs placement
uses there are charged to their (deployment, cluster), the rest of what is held to the
pool's idle row (deployment ""). An interval is split at UTC hour boundaries, one ledger
row per hour, so the ledger's GPU-hours always sum to (GPUs × hours) exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)
IDLE = ""
"""The `deployment` (and `cluster`) of a ledger row for held GPUs no placement uses."""
EXPIRY_THRESHOLDS_DAYS = (30, 7, 1)
"""A reservation is warned about when fewer than these days of its term are left."""
GROUPS = ("deployment", "cluster", "provider", "pool", "purchase_type")
MILLION = 1_000_000
GB = 1_000_000_000
DAYS_PER_MONTH = 30.4375  # 365.25 / 12: a month's share of a window


def floor_hour(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return at.replace(minute=0, second=0, microsecond=0)


def hour_slices(start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """[start, end) cut at UTC hour boundaries: (hour, hours of it), empty when end <= start."""
    out: list[tuple[datetime, float]] = []
    at = start
    while at < end:
        hour = floor_hour(at)
        stop = min(hour + HOUR, end)
        out.append((hour, (stop - at) / HOUR))
        at = stop
    return out


# --- the ledger ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolHolding:
    """One pool as the fleet stands: GPUs paid for (`held`), GPUs placed there per
    (deployment, cluster), its price and the dimensions a ledger row carries."""

    pool: str
    provider: str
    region: str
    gpu_type: str
    purchase_type: str
    price_per_gpu_hour: float
    held_gpus: int
    used: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class LedgerKey:
    hour: datetime
    pool: str
    deployment: str
    cluster: str


@dataclass(frozen=True)
class Accrual:
    """What one ledger row grows by."""

    key: LedgerKey
    provider: str
    region: str
    gpu_type: str
    purchase_type: str
    held_gpu_hours: float
    used_gpu_hours: float
    cost: float


def held_gpus(
    purchase_type: str,
    gpus: int,
    held_instances_gpus: int,
    committed_gpus: int | None,
    term: tuple[datetime | None, datetime | None],
    at: datetime,
) -> int:
    """GPUs paid for at `at`: a reservation's commitment within its term (none outside it),
    otherwise the pool's declared GPUs plus the instances procurement holds there — which it
    buys only beyond the declared ones, as placement counts them (the larger of the two
    left the smaller out of the ledger)."""
    if purchase_type == "reserved":
        start, end = term
        if (start is not None and at < start) or (end is not None and at >= end):
            return 0
        return committed_gpus or gpus
    return gpus + held_instances_gpus


def accrue(holdings: Iterable[PoolHolding], start: datetime, end: datetime) -> list[Accrual]:
    """The ledger rows' growth for [start, end) with the fleet as `holdings` says."""
    slices = hour_slices(start, end)
    out: list[Accrual] = []
    for h in holdings:
        used_total = sum(g for g in h.used.values() if g > 0)
        idle = max(0, h.held_gpus - used_total)
        shares = [(d, c, g) for (d, c), g in sorted(h.used.items()) if g > 0]
        if idle:
            shares.append((IDLE, IDLE, idle))
        for hour, hours in slices:
            for deployment, cluster, gpus in shares:
                gpu_hours = gpus * hours
                out.append(
                    Accrual(
                        key=LedgerKey(hour, h.pool, deployment, cluster),
                        provider=h.provider,
                        region=h.region,
                        gpu_type=h.gpu_type,
                        purchase_type=h.purchase_type,
                        held_gpu_hours=gpu_hours,
                        used_gpu_hours=0.0 if deployment == IDLE else gpu_hours,
                        cost=gpu_hours * h.price_per_gpu_hour,
                    )
                )
    return out


def accrual_window(
    accrued_until: datetime | None, now: datetime, max_gap: timedelta
) -> tuple[datetime, datetime, timedelta]:
    """(start, end, left out): the interval to accrue now. The first accrual starts now (the
    ledger begins empty); a gap longer than `max_gap` (the worker was down) is charged only
    for its last `max_gap`, at the fleet as it stands, and the rest is reported as left out."""
    if accrued_until is None or accrued_until >= now:
        return now, now, timedelta(0)
    gap = now - accrued_until
    if gap <= max_gap:
        return accrued_until, now, timedelta(0)
    return now - max_gap, now, gap - max_gap


# --- reading the ledger back --------------------------------------------------------------


@dataclass(frozen=True)
class LedgerRow:
    """A ledger row as read back (sums over a window are of these)."""

    hour: datetime
    pool: str
    deployment: str
    cluster: str
    provider: str
    purchase_type: str
    held_gpu_hours: float
    used_gpu_hours: float
    cost: float

    def group(self, by: str) -> str:
        return str(getattr(self, by))


@dataclass
class Totals:
    cost: float = 0.0
    held_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0

    @property
    def idle_gpu_hours(self) -> float:
        return max(0.0, self.held_gpu_hours - self.used_gpu_hours)

    def add(self, part: LedgerRow | Totals) -> None:
        self.cost += part.cost
        self.held_gpu_hours += part.held_gpu_hours
        self.used_gpu_hours += part.used_gpu_hours


def grouped(rows: Iterable[LedgerRow], by: str) -> dict[str, Totals]:
    """Totals per value of `by` (one of GROUPS), largest cost first."""
    if by not in GROUPS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}, not {by!r}")
    out: dict[str, Totals] = {}
    for row in rows:
        out.setdefault(row.group(by), Totals()).add(row)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1].cost, kv[0])))


def daily(rows: Iterable[LedgerRow], by: str) -> dict[str, dict[str, float]]:
    """Cost per UTC day (ISO date) per group, days in order."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        day = out.setdefault(row.hour.astimezone(UTC).date().isoformat(), {})
        day[row.group(by)] = day.get(row.group(by), 0.0) + row.cost
    return dict(sorted(out.items()))


# --- reservations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Reservation:
    pool: str
    committed_gpus: int
    price_per_gpu_hour: float
    term_start: datetime | None
    term_end: datetime | None


@dataclass(frozen=True)
class BurnDown:
    """A reservation's commitment against what the ledger recorded in a window."""

    pool: str
    committed_gpus: int
    term_hours: float | None
    elapsed_hours: float | None
    remaining_hours: float | None
    committed_gpu_hours: float | None
    """The whole term's commitment (None: the term is open-ended)."""
    burned_gpu_hours: float | None
    """Committed GPU-hours paid up to now (the term so far)."""
    paid_gpu_hours: float
    used_gpu_hours: float
    idle_cost: float
    expiry_warning_days: int | None

    @property
    def idle_gpu_hours(self) -> float:
        return max(0.0, self.paid_gpu_hours - self.used_gpu_hours)

    @property
    def idle_fraction(self) -> float | None:
        return self.idle_gpu_hours / self.paid_gpu_hours if self.paid_gpu_hours else None


def expiry_warning(term_end: datetime | None, now: datetime) -> int | None:
    """The smallest threshold of EXPIRY_THRESHOLDS_DAYS the time left is under (0: the term
    has ended; None: no warning, or no end)."""
    if term_end is None:
        return None
    left = term_end - now
    if left <= timedelta(0):
        return 0
    crossed = [d for d in EXPIRY_THRESHOLDS_DAYS if left < timedelta(days=d)]
    return min(crossed) if crossed else None


def burn_down(r: Reservation, rows: Iterable[LedgerRow], now: datetime) -> BurnDown:
    """`rows`: the reservation's pool's ledger rows over the window."""
    mine = [row for row in rows if row.pool == r.pool]
    paid = sum(row.held_gpu_hours for row in mine)
    used = sum(row.used_gpu_hours for row in mine)
    term_hours = elapsed = remaining = committed = burned = None
    if r.term_start is not None and r.term_end is not None:
        term_hours = max(0.0, (r.term_end - r.term_start) / HOUR)
        committed = r.committed_gpus * term_hours
    if r.term_start is not None:
        until = min(now, r.term_end) if r.term_end is not None else now
        elapsed = max(0.0, (until - r.term_start) / HOUR)
        burned = r.committed_gpus * elapsed
    if r.term_end is not None:
        remaining = max(0.0, (r.term_end - now) / HOUR)
    return BurnDown(
        pool=r.pool,
        committed_gpus=r.committed_gpus,
        term_hours=term_hours,
        elapsed_hours=elapsed,
        remaining_hours=remaining,
        committed_gpu_hours=committed,
        burned_gpu_hours=burned,
        paid_gpu_hours=paid,
        used_gpu_hours=used,
        # what the idle rows cost when they accrued (the price may have changed since)
        idle_cost=sum(row.cost for row in mine if row.deployment == IDLE),
        expiry_warning_days=expiry_warning(r.term_end, now),
    )


# --- tokens, $/Mtok and the break-even ----------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """A router's cumulative counts for one deployment since `since` (its start)."""

    since: str
    input_tokens: int = 0
    output_tokens: int = 0
    response_bytes: int = 0
    cross_region_bytes: int = 0
    """Of ``response_bytes``, those a gateway sent on to a client in another region."""


def counted(
    previous: Counters | None, current: Counters, bound: int, byte_bound: int | None = None
) -> Counters:
    """What `current` adds to `previous` (the last one recorded). A counter that went back,
    or a new `since`, is a restarted router: all of `current` is new. Each token count added
    is at most `bound`, each byte count at most `byte_bound` (default `bound`): a plane's
    report may not move money without limit."""
    byte_bound = bound if byte_bound is None else byte_bound
    restarted = (
        previous is None
        or previous.since != current.since
        or current.input_tokens < previous.input_tokens
        or current.output_tokens < previous.output_tokens
        or current.response_bytes < previous.response_bytes
        or current.cross_region_bytes < previous.cross_region_bytes
    )
    base = Counters(current.since) if restarted or previous is None else previous
    return Counters(
        current.since,
        min(bound, current.input_tokens - base.input_tokens),
        min(bound, current.output_tokens - base.output_tokens),
        min(byte_bound, current.response_bytes - base.response_bytes),
        min(byte_bound, current.cross_region_bytes - base.cross_region_bytes),
    )


@dataclass(frozen=True)
class ApiPrice:
    name: str
    model_id: str
    input_per_mtok: float
    output_per_mtok: float
    source: str = ""

    def blended_per_mtok(self, input_tokens: int, output_tokens: int) -> float:
        """Dollars per million tokens at the deployment's own input:output mix (1:1 when
        it served none)."""
        total = input_tokens + output_tokens
        if total == 0:
            return (self.input_per_mtok + self.output_per_mtok) / 2
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / total


@dataclass(frozen=True)
class Comparison:
    price: ApiPrice
    api_cost: float
    """What the window's tokens would have cost at this API price."""
    break_even_tokens: float | None
    """Tokens over the window at which the API would cost what the GPUs did (None: the API
    price is 0)."""

    def saving(self, gpu_cost: float) -> float:
        return self.api_cost - gpu_cost


@dataclass(frozen=True)
class TokenCost:
    deployment: str
    model_id: str
    input_tokens: int
    output_tokens: int
    cost: float
    comparisons: list[Comparison]

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def dollars_per_mtok(self) -> float | None:
        return self.cost / self.tokens * MILLION if self.tokens else None


def token_cost(
    deployment: str,
    model_id: str,
    cost: float,
    input_tokens: int,
    output_tokens: int,
    prices: Sequence[ApiPrice],
) -> TokenCost:
    """$/Mtok of a deployment over a window (its GPU cost there over its tokens) and, per
    API price for its model, the API's cost of those tokens and the break-even volume."""
    comparisons = []
    for p in prices:
        if p.model_id != model_id:
            continue
        blended = p.blended_per_mtok(input_tokens, output_tokens)
        api_cost = (input_tokens * p.input_per_mtok + output_tokens * p.output_per_mtok) / MILLION
        even = cost / blended * MILLION if blended > 0 else None
        comparisons.append(Comparison(p, api_cost, even))
    return TokenCost(deployment, model_id, input_tokens, output_tokens, cost, comparisons)


# --- TCO ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostRates:
    """The configurable lines of the TCO (settings `GPUFLEET_COST_*`)."""

    egress_dollars_per_gb: float = 0.0
    storage_dollars_per_month: float = 0.0
    engineering_dollars_per_month: float = 0.0


@dataclass(frozen=True)
class Line:
    name: str
    cost: float
    note: str = ""


@dataclass(frozen=True)
class Tco:
    gpu_by_purchase_type: dict[str, float]
    lines: list[Line]

    @property
    def gpu(self) -> float:
        return sum(self.gpu_by_purchase_type.values())

    @property
    def total(self) -> float:
        return self.gpu + sum(line.cost for line in self.lines)


def month_share(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start) / timedelta(days=DAYS_PER_MONTH))


def tco(
    rows: Iterable[LedgerRow],
    response_bytes: int,
    rates: CostRates,
    start: datetime,
    end: datetime,
    cross_region_bytes: int = 0,
) -> Tco:
    """GPU cost by purchase type from the ledger; data transfer (the bytes gateways sent on
    to clients in another region than the plane × $/GB), storage and engineering (monthly
    figures prorated to the window)."""
    by_type = {t: 0.0 for t in ("reserved", "on_demand", "spot")}
    for row in rows:
        by_type[row.purchase_type] = by_type.get(row.purchase_type, 0.0) + row.cost
    months = month_share(start, end)
    transfer_note = (
        f"{cross_region_bytes:,} of the {response_bytes:,} bytes the planes served crossed "
        f"regions through a gateway × ${rates.egress_dollars_per_gb:g}/GB "
        "(GPUFLEET_COST_EGRESS_DOLLARS_PER_GB)"
    )
    if rates.egress_dollars_per_gb == 0:
        transfer_note += "; 0 until the egress price is set"
    lines = [
        Line("data_transfer", cross_region_bytes / GB * rates.egress_dollars_per_gb, transfer_note),
        Line(
            "storage",
            rates.storage_dollars_per_month * months,
            f"${rates.storage_dollars_per_month:g}/month (GPUFLEET_COST_STORAGE_DOLLARS_PER_MONTH)"
            f" × {months:.3f} month(s)",
        ),
        Line(
            "engineering",
            rates.engineering_dollars_per_month * months,
            f"${rates.engineering_dollars_per_month:g}/month "
            f"(GPUFLEET_COST_ENGINEERING_DOLLARS_PER_MONTH) × {months:.3f} month(s)",
        ),
    ]
    return Tco(by_type, lines)


# --- moving work onto idle reservations ---------------------------------------------------


@dataclass(frozen=True)
class PoolPrice:
    purchase_type: str
    price_per_gpu_hour: float
    capacity_gpus: int
    """What the placement may use there (a reservation: its committed, held GPUs)."""


@dataclass(frozen=True)
class Spend:
    """One placement's hourly spend beyond what reservations already pay for."""

    marginal_per_hour: float
    """On-demand and spot GPUs used × their price (reserved GPUs are paid used or not)."""
    reserved_used_gpus: int
    reserved_idle_gpus: int


def spend(placed: Iterable[tuple[str, int]], pools: Mapping[str, PoolPrice]) -> Spend:
    """``placed``: (pool, GPUs) of each assignment; pools unknown to ``pools`` are skipped."""
    used: dict[str, int] = {}
    for pool, gpus in placed:
        if pool in pools:
            used[pool] = used.get(pool, 0) + gpus
    marginal = sum(
        gpus * pools[p].price_per_gpu_hour
        for p, gpus in used.items()
        if pools[p].purchase_type != "reserved"
    )
    reserved = {p: v for p, v in pools.items() if v.purchase_type == "reserved"}
    reserved_used = sum(min(used.get(p, 0), v.capacity_gpus) for p, v in reserved.items())
    reserved_capacity = sum(v.capacity_gpus for v in reserved.values())
    return Spend(marginal, reserved_used, max(0, reserved_capacity - reserved_used))


@dataclass(frozen=True)
class Rebalance:
    """The placement as it stands against one made afresh (no churn kept)."""

    now: Spend
    fresh: Spend
    moved_replicas: int
    unplaced_replicas_now: int
    unplaced_replicas_fresh: int

    @property
    def saving_per_hour(self) -> float:
        return self.now.marginal_per_hour - self.fresh.marginal_per_hour


def moved_replicas(
    now: Iterable[tuple[str, str, int]], fresh: Iterable[tuple[str, str, int]]
) -> int:
    """Replicas a fresh placement puts elsewhere: over (deployment, pool), what ``now`` has
    beyond ``fresh``. Entries: (deployment, pool, replicas)."""
    before: dict[tuple[str, str], int] = {}
    for d, p, n in now:
        before[(d, p)] = before.get((d, p), 0) + n
    after: dict[tuple[str, str], int] = {}
    for d, p, n in fresh:
        after[(d, p)] = after.get((d, p), 0) + n
    return sum(max(0, n - after.get(k, 0)) for k, n in before.items())
