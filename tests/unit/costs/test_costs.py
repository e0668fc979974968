"""The cost arithmetic (issue 19, cost half): ledger accrual, reservations, $/Mtok, TCO."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane import costs
from controlplane.costs import (
    IDLE,
    ApiPrice,
    CostRates,
    Counters,
    LedgerRow,
    PoolHolding,
    Reservation,
    accrual_window,
    accrue,
    burn_down,
    counted,
    daily,
    expiry_warning,
    grouped,
    held_gpus,
    hour_slices,
    tco,
    token_cost,
)

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def holding(pool: str = "use1-rsv", held: int = 16, price: float = 2.0, **used: int) -> PoolHolding:
    return PoolHolding(
        pool=pool,
        provider="aws-main",
        region="aws-us-east-1",
        gpu_type="H100-80G",
        purchase_type="reserved",
        price_per_gpu_hour=price,
        held_gpus=held,
        used={(d, "use1-a"): g for d, g in used.items()},
    )


def row(
    pool: str = "use1-rsv",
    deployment: str = "chat",
    held: float = 1.0,
    used: float = 1.0,
    cost: float = 2.0,
    hour: datetime = T0,
    purchase_type: str = "reserved",
) -> LedgerRow:
    return LedgerRow(hour, pool, deployment, "use1-a", "aws-main", purchase_type, held, used, cost)


# --- accrual --------------------------------------------------------------------------------


def test_an_interval_is_cut_at_hour_boundaries():
    start = T0 + timedelta(minutes=45)
    slices = hour_slices(start, start + timedelta(minutes=30))
    assert slices == [(T0, 0.25), (T0 + timedelta(hours=1), 0.25)]
    assert hour_slices(T0, T0) == []


def test_placed_gpus_are_charged_to_their_deployment_and_the_rest_to_idle():
    rows = accrue([holding(held=16, price=2.0, chat=8)], T0, T0 + timedelta(minutes=30))
    by_deployment = {a.key.deployment: a for a in rows}
    assert by_deployment["chat"].used_gpu_hours == pytest.approx(4.0)
    assert by_deployment["chat"].cost == pytest.approx(8.0)
    assert by_deployment[IDLE].held_gpu_hours == pytest.approx(4.0)
    assert by_deployment[IDLE].used_gpu_hours == 0.0
    assert by_deployment[IDLE].key.cluster == IDLE
    assert sum(a.cost for a in rows) == pytest.approx(16 * 0.5 * 2.0)


def test_more_placed_than_held_is_paid_as_placed_and_nothing_idle():
    rows = accrue([holding(held=0, price=3.0, chat=8)], T0, T0 + timedelta(hours=1))
    assert [(a.key.deployment, a.cost) for a in rows] == [("chat", pytest.approx(24.0))]


def test_a_pool_with_nothing_held_or_placed_accrues_nothing():
    assert accrue([holding(held=0)], T0, T0 + timedelta(hours=1)) == []


@given(
    start_min=st.integers(0, 59),
    minutes=st.integers(0, 600),
    held=st.integers(0, 64),
    used=st.integers(0, 64),
)
def test_gpu_hours_over_any_interval_are_gpus_times_hours(start_min, minutes, held, used):
    start = T0 + timedelta(minutes=start_min)
    rows = accrue([holding(held=held, chat=used)], start, start + timedelta(minutes=minutes))
    hours = minutes / 60
    assert sum(a.held_gpu_hours for a in rows) == pytest.approx(max(held, used) * hours)
    assert sum(a.used_gpu_hours for a in rows) == pytest.approx(used * hours)
    assert all(a.key.hour.minute == 0 for a in rows)


def test_accruing_in_pieces_adds_up_to_accruing_at_once():
    h = [holding(held=16, chat=4)]
    whole = accrue(h, T0, T0 + timedelta(hours=2, minutes=10))
    pieces = [
        a
        for i in range(13)
        for a in accrue(h, T0 + timedelta(minutes=10 * i), T0 + timedelta(minutes=10 * (i + 1)))
    ]
    assert sum(a.cost for a in pieces) == pytest.approx(sum(a.cost for a in whole))


def test_the_first_accrual_starts_now_and_a_long_gap_is_capped():
    assert accrual_window(None, T0, timedelta(hours=1)) == (T0, T0, timedelta(0))
    start, end, left = accrual_window(T0 - timedelta(minutes=1), T0, timedelta(hours=1))
    assert (start, end, left) == (T0 - timedelta(minutes=1), T0, timedelta(0))
    start, end, left = accrual_window(T0 - timedelta(hours=5), T0, timedelta(hours=1))
    assert (start, left) == (T0 - timedelta(hours=1), timedelta(hours=4))
    # a clock that went back accrues nothing
    assert accrual_window(T0 + timedelta(seconds=5), T0, timedelta(hours=1))[:2] == (T0, T0)


def test_a_reservation_is_paid_only_within_its_term():
    term = (T0, T0 + timedelta(days=30))
    assert held_gpus("reserved", 16, 0, 12, term, T0) == 12
    assert held_gpus("reserved", 16, 0, None, term, T0) == 16
    assert held_gpus("reserved", 16, 0, 12, term, T0 - timedelta(seconds=1)) == 0
    assert held_gpus("reserved", 16, 0, 12, term, T0 + timedelta(days=30)) == 0
    # declared GPUs and the instances bought beyond them, as placement counts the pool
    assert held_gpus("on_demand", 8, 16, None, (None, None), T0) == 24
    assert held_gpus("spot", 8, 0, None, (None, None), T0) == 8


# --- reading it back ------------------------------------------------------------------------


def test_grouped_sums_and_orders_by_cost():
    rows = [
        row(deployment="chat", cost=2.0),
        row(deployment="chat", cost=1.0),
        row(deployment="batch", cost=5.0, purchase_type="spot"),
    ]
    by = grouped(rows, "deployment")
    assert list(by) == ["batch", "chat"]
    assert by["chat"].cost == pytest.approx(3.0)
    assert list(grouped(rows, "purchase_type")) == ["spot", "reserved"]
    with pytest.raises(ValueError, match="group_by must be one of"):
        grouped(rows, "region")


def test_daily_costs_are_per_utc_day():
    rows = [row(hour=T0, cost=1.0), row(hour=T0 + timedelta(days=1), cost=2.0)]
    assert daily(rows, "deployment") == {"2026-03-01": {"chat": 1.0}, "2026-03-02": {"chat": 2.0}}


# --- reservations ---------------------------------------------------------------------------


def reservation(days: int = 365, elapsed_days: int = 100) -> Reservation:
    start = T0 - timedelta(days=elapsed_days)
    return Reservation("use1-rsv", 16, 2.0, start, start + timedelta(days=days))


def test_burn_down_against_the_term_and_idle_from_the_ledger():
    rows = [
        row(deployment="chat", held=10.0, used=10.0),
        row(deployment=IDLE, held=4.0, used=0.0, cost=8.0),
        row(deployment=IDLE, held=2.0, used=0.0, cost=3.0, hour=T0 - timedelta(hours=1)),
        row(pool="other", held=99.0, used=0.0),
    ]
    b = burn_down(reservation(), rows, T0)
    assert b.committed_gpu_hours == pytest.approx(16 * 365 * 24)
    assert b.burned_gpu_hours == pytest.approx(16 * 100 * 24)
    assert b.remaining_hours == pytest.approx(265 * 24)
    assert (b.paid_gpu_hours, b.used_gpu_hours, b.idle_gpu_hours) == (16.0, 10.0, 6.0)
    assert b.idle_fraction == pytest.approx(6 / 16)
    # at the price of each hour it was idle ($1.50 before a rise to today's $2.00), not
    # all of it at today's
    assert b.idle_cost == pytest.approx(11.0)
    assert b.expiry_warning_days is None


def test_an_open_ended_reservation_has_no_total_and_no_warning():
    b = burn_down(Reservation("r", 8, 1.0, None, None), [], T0)
    assert (b.committed_gpu_hours, b.burned_gpu_hours, b.remaining_hours) == (None, None, None)
    assert b.idle_fraction is None
    assert b.expiry_warning_days is None


@pytest.mark.parametrize(
    ("left", "warning"),
    [
        (timedelta(days=31), None),
        (timedelta(days=30), None),
        (timedelta(days=29, hours=23), 30),
        (timedelta(days=7, seconds=1), 30),
        (timedelta(days=6), 7),
        (timedelta(hours=23), 1),
        (timedelta(0), 0),
        (-timedelta(days=3), 0),
    ],
)
def test_expiry_warnings_at_30_7_and_1_days(left, warning):
    assert expiry_warning(T0 + left, T0) == warning


# --- tokens ---------------------------------------------------------------------------------


def test_router_counters_become_increments_and_a_restart_is_seen():
    first = counted(None, Counters("r1", 100, 50, 1000), bound=10**9)
    assert first == Counters("r1", 100, 50, 1000)
    later = counted(Counters("r1", 100, 50, 1000), Counters("r1", 130, 70, 1500), 10**9)
    assert later == Counters("r1", 30, 20, 500)
    assert counted(Counters("r1", 130, 70, 1500), Counters("r1", 130, 70, 1500), 10**9) == (
        Counters("r1", 0, 0, 0)
    )
    # a restarted router: a new `since`, or counters that went back
    assert counted(Counters("r1", 130, 70, 1500), Counters("r2", 5, 6, 7), 10**9) == Counters(
        "r2", 5, 6, 7
    )
    assert counted(Counters("r1", 130, 70, 1500), Counters("r1", 5, 80, 1600), 10**9) == (
        Counters("r1", 5, 80, 1600)
    )


def test_cross_region_bytes_count_up_like_the_rest():
    before = Counters("r1", 100, 50, 1000, 400)
    assert counted(before, Counters("r1", 110, 60, 1500, 700), 10**9) == Counters(
        "r1", 10, 10, 500, 300
    )
    # only that counter went back: the router restarted all the same
    assert counted(before, Counters("r1", 110, 60, 1500, 10), 10**9) == Counters(
        "r1", 110, 60, 1500, 10
    )


def test_an_increment_is_bounded():
    assert counted(None, Counters("r", 10**12, 3, 0), bound=1000) == Counters("r", 1000, 3, 0)


LLAMA = "meta-llama/Llama-3.1-70B-Instruct"


def test_dollars_per_mtok_and_the_break_even_volume():
    prices = [
        ApiPrice("together-llama-70b", LLAMA, 0.88, 0.88, "together.ai"),
        ApiPrice("gpt-4o-mini", "openai/gpt-4o-mini", 0.15, 0.60),
    ]
    t = token_cost(
        "triage", LLAMA, cost=44.0, input_tokens=30_000_000, output_tokens=10_000_000, prices=prices
    )
    assert t.dollars_per_mtok == pytest.approx(44.0 / 40)
    (c,) = t.comparisons  # only the deployment's model
    assert c.api_cost == pytest.approx(40 * 0.88)
    assert c.break_even_tokens == pytest.approx(44.0 / 0.88 * 1_000_000)
    assert c.saving(44.0) == pytest.approx(35.2 - 44.0)


def test_the_blend_follows_the_deployments_own_mix():
    p = ApiPrice("p", LLAMA, 1.0, 3.0)
    assert p.blended_per_mtok(3, 1) == pytest.approx(1.5)
    assert p.blended_per_mtok(0, 0) == pytest.approx(2.0)
    t = token_cost("d", LLAMA, 10.0, 0, 0, [p, ApiPrice("free", LLAMA, 0, 0)])
    assert t.dollars_per_mtok is None
    assert [c.break_even_tokens for c in t.comparisons] == [pytest.approx(5_000_000), None]


# --- TCO ------------------------------------------------------------------------------------


def test_tco_lines_over_a_week():
    start = T0
    end = T0 + timedelta(days=7)
    rows = [row(cost=100.0), row(cost=20.0, purchase_type="spot")]
    rates = CostRates(
        egress_dollars_per_gb=0.09,
        storage_dollars_per_month=304.375,
        engineering_dollars_per_month=30_437.5,
    )
    # 80 GB served, 50 GB of them to clients in another region: only those are transfer
    t = tco(rows, 80 * 10**9, rates, start, end, cross_region_bytes=50 * 10**9)
    assert t.gpu_by_purchase_type == {"reserved": 100.0, "on_demand": 0.0, "spot": 20.0}
    lines = {line.name: line.cost for line in t.lines}
    assert lines["data_transfer"] == pytest.approx(4.5)
    (transfer,) = [line for line in t.lines if line.name == "data_transfer"]
    assert "50,000,000,000 of the 80,000,000,000 bytes" in transfer.note
    assert lines["storage"] == pytest.approx(70.0)  # 7 of 30.4375 days
    assert lines["engineering"] == pytest.approx(7000.0)
    assert t.total == pytest.approx(120 + 4.5 + 70 + 7000)


def test_transfer_without_a_price_is_zero_and_says_so():
    t = tco([], response_bytes=10**9, rates=CostRates(), start=T0, end=T0 + timedelta(days=1))
    (transfer,) = [line for line in t.lines if line.name == "data_transfer"]
    assert transfer.cost == 0
    assert "0 until the egress price is set" in transfer.note


# --- moving work onto idle reservations -----------------------------------------------------


def test_spend_counts_only_what_reservations_do_not_already_pay_for():
    pools = {
        "rsv": costs.PoolPrice("reserved", 2.0, 16),
        "od": costs.PoolPrice("on_demand", 4.0, 8),
        "spot": costs.PoolPrice("spot", 1.5, 8),
    }
    now = costs.spend([("od", 8), ("spot", 4), ("rsv", 4), ("gone", 8)], pools)
    assert now.marginal_per_hour == 8 * 4.0 + 4 * 1.5  # a pool no longer known: skipped
    assert (now.reserved_used_gpus, now.reserved_idle_gpus) == (4, 12)
    fresh = costs.spend([("rsv", 12), ("spot", 4)], pools)
    r = costs.Rebalance(now, fresh, moved_replicas=2, unplaced_replicas_now=0,
                        unplaced_replicas_fresh=0)  # fmt: skip
    assert r.saving_per_hour == 32.0
    over = costs.spend([("rsv", 20)], pools)  # never more reserved GPUs used than it has
    assert (over.reserved_used_gpus, over.reserved_idle_gpus) == (16, 0)


def test_moved_replicas_are_what_now_has_beyond_the_fresh_placement():
    now = [("chat", "od", 2), ("chat", "rsv", 1), ("code", "rsv", 3)]
    fresh = [("chat", "rsv", 3), ("code", "rsv", 2), ("code", "spot", 1)]
    assert costs.moved_replicas(now, fresh) == 3  # chat's 2 off od, one of code's off rsv
    assert costs.moved_replicas(now, now) == 0


def test_an_accrual_gap_shorter_than_two_periods_is_refused():
    """30 s of gap for a 60 s period left 30 s of every tick out of the ledger."""
    from controlplane.settings import Settings

    with pytest.raises(ValueError, match="at least twice GPUFLEET_COST_ACCRUE_EVERY_S"):
        Settings(cost_accrue_every_s=60, cost_accrual_max_gap_s=30)
    assert (
        Settings(cost_accrue_every_s=60, cost_accrual_max_gap_s=120).cost_accrual_max_gap_s == 120
    )
