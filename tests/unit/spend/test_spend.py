"""The spend guard bounds what reported demand may add (issue 12 item 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from controlplane.spend import Ask, Grant, SpendLimits, allow, granted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
H100 = 3.93


def ask(name: str = "chat", baseline: int = 1, wanted: int = 1, gpus: int = 1) -> Ask:
    return Ask(name, baseline, wanted, gpus_per_replica=gpus, price_per_gpu_hour=H100)


def test_demand_within_every_bound_is_granted_in_full():
    allowance = allow([ask(wanted=4)], {}, T0, SpendLimits())
    assert allowance.wanted == {"chat": 4}
    assert allowance.bites == []


def test_a_forged_demand_is_held_to_the_gpus_per_deployment_bound():
    limits = SpendLimits(gpus_per_deployment=16)
    allowance = allow([ask(baseline=1, wanted=6, gpus=8)], {}, T0, limits)
    assert allowance.wanted == {"chat": 3}  # 2 more replicas of 8 GPUs
    (bite,) = allowance.bites
    assert (bite.bound, bite.asked, bite.allowed) == ("gpus_per_deployment", 6, 3)
    assert bite.setting == "GPUFLEET_SPEND_GUARD_GPUS_PER_DEPLOYMENT"
    assert "raise GPUFLEET_SPEND_GUARD_GPUS_PER_DEPLOYMENT" in bite.message


def test_what_was_added_within_the_window_counts_and_ages_out():
    limits = SpendLimits(gpus_per_deployment=8)
    history = {"chat": [Grant(T0, 8, 31.47)]}
    held = allow([ask(baseline=3, wanted=5)], history, T0 + timedelta(minutes=30), limits)
    assert held.wanted == {"chat": 3}
    later = allow([ask(baseline=3, wanted=5)], history, T0 + timedelta(minutes=61), limits)
    assert later.wanted == {"chat": 5}


def test_the_fleet_wide_ceiling_is_shared_in_one_call():
    limits = SpendLimits(fleet_cost=10 * H100 + 0.01)
    asks = [ask("a", 0, 8), ask("b", 0, 8)]
    allowance = allow(asks, {}, T0, limits)
    assert allowance.wanted == {"a": 8, "b": 2}
    assert [(b.deployment, b.bound) for b in allowance.bites] == [("b", "fleet_cost")]


def test_shrinking_and_the_spec_floor_are_never_bounded():
    limits = SpendLimits(gpus_per_deployment=0, cost_per_deployment=0, fleet_cost=0)
    allowance = allow([ask(baseline=3, wanted=1), ask("b", 2, 2)], {}, T0, limits)
    assert allowance.wanted == {"chat": 1, "b": 2}
    assert allowance.bites == []


def test_a_grant_is_what_placement_added_above_the_baseline_at_the_checked_price():
    """Kept at the upper estimate the guard checked (`Ask.price_per_gpu_hour`), never the
    deployment's average: cheap replicas already placed must not make dear new ones look
    cheap (8 on a $1 pool + 8 new on a $10 one were kept as $44/h, not $80/h)."""
    wish = ask(baseline=1, wanted=4, gpus=2)
    assert granted(wish, placed=3, now=T0) == Grant(
        T0, 4, round(2 * 2 * wish.price_per_gpu_hour, 6)
    )
    assert granted(wish, placed=1, now=T0) is None


@given(
    st.lists(st.tuples(st.integers(0, 10), st.integers(0, 40), st.integers(1, 8)), max_size=6),
    st.integers(0, 128),
    st.floats(0, 2000),
    st.floats(0, 4000),
)
def test_the_guard_never_lets_growth_pass_a_bound(rows, gpus_cap, dep_cost, fleet_cost):
    limits = SpendLimits(
        gpus_per_deployment=gpus_cap, cost_per_deployment=dep_cost, fleet_cost=fleet_cost
    )
    asks = [ask(f"d{i}", b, w, g) for i, (b, w, g) in enumerate(rows)]
    allowance = allow(asks, {}, T0, limits)
    fleet = 0.0
    for a in asks:
        got = allowance.wanted[a.deployment]
        assert got <= max(a.wanted, a.baseline) and got >= min(a.wanted, a.baseline)
        growth = max(0, got - a.baseline)
        assert growth * a.gpus_per_replica <= gpus_cap
        assert growth * a.cost_per_replica <= dep_cost + 1e-6
        fleet += growth * a.cost_per_replica
    assert fleet <= fleet_cost + 1e-6
