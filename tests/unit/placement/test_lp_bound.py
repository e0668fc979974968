"""The bench's LP bound (`lp.py`) is a valid lower bound, and its divisibility cuts tighten it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.placement import PlacementInput, PlacementResult, place
from controlplane.placement.lp import (
    high_priority_unplaced_optimum,
    integral_cost_bound,
    lower_bound,
)
from tests.unit.placement.builders import REGIONS, make_deployment, make_input, make_pool
from tests.unit.placement.test_properties import PROVIDER_OF, SETTINGS

TOL = 1e-6
TRAFFIC = ({}, {"aws:us-east-1": 1.0}, {"aws:eu-central-1": 1.0})


@st.composite
def crowded(draw) -> PlacementInput:
    """Few pools of any size (odd remainders), big replicas of several shapes sharing them:
    where the divisibility cuts bind. Spread and spot policies too, for the spread cuts."""
    ps = []
    for i in range(draw(st.integers(1, 3))):
        region = draw(st.sampled_from([r.name for r in REGIONS]))
        purchase = draw(st.sampled_from(["reserved", "on_demand", "spot"]))
        ps.append(
            make_pool(
                f"p{i}",
                provider=PROVIDER_OF[region],
                region=region,
                gpu_type="H100",
                purchase=purchase,
                capacity=draw(st.integers(4, 28)),
                procurable=draw(st.sampled_from([0, 0, 4, 12])),
                price=draw(st.floats(0.5, 5.0)),
                interruption_rate=0.1 if purchase == "spot" else 0,
            )
        )
    ds = [
        make_deployment(
            f"d{i}",
            gpus=draw(st.sampled_from([8, 4, 2, 1])),
            replicas=draw(st.integers(1, 4)),
            gpu_types=draw(st.sampled_from([("H100",), ("H100", "L4")])),  # two shapes
            priority=draw(st.integers(0, 1)),
            traffic=draw(st.sampled_from(TRAFFIC)),
            spot_allowed=draw(st.booleans()),  # spot and spread: the spread cuts are tested too
            max_spot_fraction=draw(st.sampled_from([0.0, 0.5])),
            min_distinct_providers=draw(st.integers(1, 2)),
            min_distinct_regions=draw(st.integers(1, 2)),
        )
        for i in range(draw(st.integers(2, 5)))
    ]
    return make_input(ps, ds)


def placed_gpus(inp: PlacementInput, result: PlacementResult) -> int:
    size = {d.name: d.gpus_per_replica for d in inp.deployments}
    return sum(a.replicas * size[a.deployment] for a in result.assignments)


@settings(SETTINGS, max_examples=200)  # ~2 s; the cuts bind in about 1 example of 14
@given(crowded())
def test_lp_with_cuts_never_exceeds_a_whole_replica_placement(inp):
    result = place(inp)
    volume = placed_gpus(inp, result)
    cut = lower_bound(inp, placed_gpus=volume - 1e-6)
    plain = lower_bound(inp, placed_gpus=volume - 1e-6, divisibility_cuts=False)
    slack = TOL * (1.0 + abs(result.objective_per_hour))
    # the engine's placement is whole-replica and feasible: no valid bound lies above it
    assert cut.cost <= result.objective_per_hour + slack
    assert cut.cost >= plain.cost - slack  # cuts only tighten
    unplaced = sum(u.replicas * u.gpus_per_replica for u in result.unplaced)
    assert lower_bound(inp).unplaced_bound <= unplaced + TOL
    low = min(d.priority for d in inp.deployments)
    above = {d.name for d in inp.deployments if d.priority > low}
    high = sum(u.replicas * u.gpus_per_replica for u in result.unplaced if u.deployment in above)
    assert high_priority_unplaced_optimum(inp, time_limit=5.0).unplaced_bound <= high + TOL


def test_the_high_priority_optimum_gives_the_lowest_priority_up_first():
    # 16 GPUs, demand 24: the plain optimum leaves the 8-GPU replica of prod out (8 GPUs
    # either way); the priority one leaves batch's two 4-GPU replicas out instead
    inp = make_input(
        [make_pool("a", capacity=16)],
        [
            make_deployment("prod", gpus=8, replicas=2, priority=1),
            make_deployment("batch", gpus=4, replicas=2, priority=0),
        ],
    )
    best = high_priority_unplaced_optimum(inp)
    assert (best.unplaced_gpus, best.unplaced_bound) == (0.0, 0.0)
    result = place(inp)
    assert [(u.deployment, u.replicas) for u in result.unplaced] == [("batch", 2)]
    one_level = make_input(
        [make_pool("a", capacity=16)], [make_deployment("x", gpus=8, replicas=3)]
    )
    assert high_priority_unplaced_optimum(one_level).unplaced_gpus == 0.0  # nobody above


def test_cuts_close_the_gap_that_fractional_big_replicas_open():
    # pool a (12 GPUs) fits one 8-GPU replica; two 8-GPU classes (different GPU types)
    # share it, so the plain LP puts 1.5 replicas there (12 GPUs at $1, 4 at $3: $24)
    inp = make_input(
        [make_pool("a", capacity=12, price=1.0), make_pool("b", capacity=16, price=3.0)],
        [
            make_deployment("x", gpus=8, replicas=1),
            make_deployment("y", gpus=8, replicas=1, gpu_types=("H100", "L4")),
        ],
    )
    plain = lower_bound(inp, placed_gpus=16, divisibility_cuts=False).cost
    cut = lower_bound(inp, placed_gpus=16).cost
    # whole replicas: one in a, one in b ($8 + $24), or both in b ($48)
    optimum = 32.0
    assert plain == pytest.approx(24.0)
    assert cut == pytest.approx(optimum)
    assert integral_cost_bound(inp, 16).cost == pytest.approx(optimum)
    result = place(inp)
    assert placed_gpus(inp, result) == 16
    assert result.objective_per_hour == pytest.approx(optimum)
    assert lower_bound(inp).cost == pytest.approx(optimum)  # the same without a volume
    assert math.isinf(lower_bound(inp, placed_gpus=40).cost)  # more than fits: no placement
