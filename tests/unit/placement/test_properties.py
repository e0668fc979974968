"""Invariants of place() on random small worlds (hypothesis)."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.placement import place, replan
from tests.unit.placement.builders import REGIONS, make_deployment, make_input, make_pool
from tests.unit.placement.rules import check_rules

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI must not flake
    suppress_health_check=[HealthCheck.too_slow],
)
PROVIDER_OF = {r.name: r.name.split(":")[0] for r in REGIONS}


@st.composite
def pools(draw, ample: bool = False):
    n = draw(st.integers(1, 6))
    out = []
    for i in range(n):
        region = draw(st.sampled_from([r.name for r in REGIONS]))
        purchase = draw(st.sampled_from(["reserved", "on_demand", "spot"]))
        gpi = draw(st.sampled_from([4, 8]))
        cap = draw(st.integers(0, 4)) * gpi
        out.append(
            make_pool(
                f"p{i}",
                provider=PROVIDER_OF[region],
                region=region,
                gpu_type=draw(st.sampled_from(["H100", "L4"])),
                purchase=purchase,
                capacity=cap,
                procurable=0
                if purchase == "reserved"
                else (64 if ample else draw(st.integers(0, 16))),
                price=draw(st.floats(0.5, 5.0)),
                interruption_rate=0.1 if purchase == "spot" else 0,
                certifications=draw(st.sampled_from([frozenset(), frozenset({"HIPAA"})])),
                gpus_per_instance=gpi,
            )
        )
    return out


@st.composite
def deployments(draw):
    n = draw(st.integers(1, 5))
    return [
        make_deployment(
            f"d{i}",
            gpus=draw(st.sampled_from([1, 2, 4, 8])),
            replicas=draw(st.integers(0, 5)),
            gpu_types=tuple(draw(st.sets(st.sampled_from(["H100", "L4"]), min_size=1))),
            priority=draw(st.integers(0, 2)),
            allowed_jurisdictions=draw(st.sampled_from([frozenset(), frozenset({"US"})])),
            required_certifications=draw(st.sampled_from([frozenset(), frozenset({"HIPAA"})])),
            spot_allowed=draw(st.booleans()),
            max_spot_fraction=draw(st.sampled_from([0.0, 0.5])),
            min_distinct_providers=draw(st.integers(1, 2)),
            min_distinct_regions=draw(st.integers(1, 2)),
        )
        for i in range(n)
    ]


@SETTINGS
@given(pools(), deployments())
def test_constraints_hold_and_no_pool_is_overcommitted(ps, ds):
    inp = make_input(ps, ds)
    check_rules(inp, place(inp))


@SETTINGS
@given(pools(), deployments())
def test_deterministic_and_unchanged_input_moves_nothing(ps, ds):
    inp = make_input(ps, ds)
    first, second = place(inp), place(inp)
    assert (first.assignments, first.unplaced) == (second.assignments, second.unplaced)
    again = place(dataclasses.replace(inp, current=first.assignments))
    assert again.changes == ()  # nothing moves, stops or starts
    assert again.assignments == first.assignments


@SETTINGS
@given(pools(ample=True), deployments(), st.integers(0, 5))
def test_removing_a_cluster_moves_only_its_replicas(ps, ds, which):
    inp = make_input(ps, ds)
    first = place(inp)
    gone = inp.clusters[which % len(inp.clusters)]
    after_inp = dataclasses.replace(
        inp, clusters=tuple(c for c in inp.clusters if c is not gone), current=first.assignments
    )
    after = place(after_inp)
    check_rules(after_inp, after)
    new = {(a.deployment, a.cluster, a.pool): a.replicas for a in after.assignments}
    short = {u.deployment for u in after.unplaced}  # capacity or spread did not allow
    for a in first.assignments:
        if a.cluster != gone.name and a.deployment not in short:
            assert new.get((a.deployment, a.cluster, a.pool), 0) >= a.replicas, a


@SETTINGS
@given(pools(), deployments(), st.integers(0, 4), st.integers(-2, 2))
def test_incremental_replan_keeps_invariants_and_touches_only_the_changed(ps, ds, which, delta):
    inp = make_input(ps, ds)
    first = place(inp)
    changed = list(inp.deployments)
    k = which % len(changed)
    target = max(0, changed[k].wanted_replicas + delta)
    changed[k] = dataclasses.replace(changed[k], wanted_replicas=target)
    new_inp = dataclasses.replace(inp, deployments=tuple(changed))
    result = replan(first, new_inp)
    check_rules(dataclasses.replace(new_inp, current=first.assignments), result)
    assert replan(result, new_inp).changes == ()  # re-planning the same input is stable
