"""Invariants of place() when almost every deployment is its own class (hypothesis).

Hundreds of deployment shapes (size, GPU types, jurisdictions, region allow-lists,
certifications, spot, spread, traffic) on one fleet: above the class LP's size limit the
engine takes another path, and the rules must hold there as well as below it.
"""

from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.placement import PlacementInput, place
from controlplane.placement.lp import lower_bound
from tests.unit.placement.builders import REGIONS, make_deployment, make_input, make_pool
from tests.unit.placement.rules import check_rules

SETTINGS = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI must not flake
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TYPES = ("H100", "A100", "L4")
CERTS = (frozenset(), frozenset({"SOC2"}), frozenset({"HIPAA"}))


def world(seed: int, n_deployments: int, load: float) -> PlacementInput:
    """A seeded fleet of 60 pools and `n_deployments` deployments of distinct traffic
    (so distinct classes), demand about `load` x the usable GPUs."""
    rng = random.Random(seed)
    pools = []
    for i in range(60):
        region = rng.choice(REGIONS)
        purchase = rng.choice(["reserved", "on_demand", "spot"])
        gpu = rng.choice(TYPES)
        pools.append(
            make_pool(
                f"p{i}",
                provider=region.name.split(":")[0],
                region=region.name,
                gpu_type=gpu,
                purchase=purchase,
                capacity=rng.randint(1, 6) * (4 if gpu == "L4" else 8),
                procurable=0 if purchase == "reserved" else rng.randint(0, 3) * 4,
                price=rng.uniform(0.5, 5.0),
                interruption_rate=0.1 if purchase == "spot" else 0.0,
                certifications=rng.choice(CERTS) | frozenset({"SOC2"}),
                gpus_per_instance=4 if gpu == "L4" else 8,
            )
        )
    deps = []
    for i in range(n_deployments):
        spot = rng.random() < 0.4
        a, b = rng.sample(REGIONS, 2)
        w = rng.randint(1, 99) / 100
        deps.append(
            make_deployment(
                f"d{i}",
                gpus=rng.choice([1, 2, 4, 8]),
                replicas=rng.randint(1, 4),
                gpu_types=tuple(rng.sample(TYPES, rng.randint(1, 2))),
                priority=rng.choice([0, 0, 1, 2]),
                traffic={a.name: w, b.name: 1 - w},  # distinct per deployment
                allowed_jurisdictions=rng.choice([frozenset(), frozenset({"US", "CA"})]),
                allowed_regions=frozenset(r.name for r in rng.sample(REGIONS, 4))
                if rng.random() < 0.2
                else frozenset(),
                required_certifications=rng.choice(CERTS),
                spot_allowed=spot,
                max_spot_fraction=0.5 if spot else 0.0,
                min_distinct_providers=rng.choice([1, 1, 2]),
                min_distinct_regions=rng.choice([1, 1, 2]),
            )
        )
    demand = sum(d.target_replicas * d.gpus_per_replica for d in deps)
    supply = sum(p.capacity_gpus + p.procurable_gpus for p in pools)
    deps = [  # scale demand to the load by trimming wanted replicas evenly
        dataclasses.replace(
            d, wanted_replicas=max(1, round(d.wanted_replicas * load * supply / demand))
        )
        for d in deps
    ]
    return make_input(pools, deps)


@SETTINGS
@given(st.integers(0, 10**6), st.sampled_from([120, 320, 500]), st.sampled_from([0.7, 0.95]))
def test_rules_hold_with_hundreds_of_classes(seed, n, load):
    inp = world(seed, n, load)
    result = place(inp)
    check_rules(inp, result)
    unplaced = sum(u.replicas * u.gpus_per_replica for u in result.unplaced)
    assert unplaced >= math.floor(lower_bound(inp).unplaced_bound)  # the bound is a bound


@SETTINGS
@given(st.integers(0, 10**6), st.sampled_from([120, 320, 500]))
def test_deterministic_and_stable_with_hundreds_of_classes(seed, n):
    inp = world(seed, n, 0.92)
    first, second = place(inp), place(inp)
    assert (first.assignments, first.unplaced) == (second.assignments, second.unplaced)
    again = place(dataclasses.replace(inp, current=first.assignments))
    assert again.changes == ()  # nothing moves, stops or starts
    assert again.assignments == first.assignments


def test_the_world_has_as_many_classes_as_deployments():
    inp = world(1, 320, 0.92)
    assert lower_bound(inp).classes == 320  # above the class LP's old limit of 300
