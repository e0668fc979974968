"""Invariants of place() on random small worlds (hypothesis)."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.placement import PlacementInput, PlacementResult, place, replan
from tests.unit.placement.builders import REGIONS, make_deployment, make_input, make_pool

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI must not flake
    suppress_health_check=[HealthCheck.too_slow],
)
PROVIDER_OF = {r.name: r.name.split(":")[0] for r in REGIONS}
JURIS = {r.name: r.jurisdiction for r in REGIONS}


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


def check_invariants(inp: PlacementInput, result: PlacementResult) -> None:
    pools = {p.id: p for p in inp.pools}
    deps = {d.name: d for d in inp.deployments}
    healthy = {c.name: set(c.pool_ids) for c in inp.clusters if c.state == "healthy"}
    used: dict[str, int] = {}
    placed: dict[str, list[tuple[str, int]]] = {}
    for a in result.assignments:
        pool, dep = pools[a.pool], deps[a.deployment]
        pol = dep.policy
        used[a.pool] = used.get(a.pool, 0) + a.replicas * dep.gpus_per_replica
        placed.setdefault(a.deployment, []).append((a.pool, a.replicas))
        assert a.pool in healthy[a.cluster]
        assert pool.gpu_type in dep.gpu_types
        assert dep.gpus_per_replica <= pool.gpus_per_instance
        assert not pol.allowed_jurisdictions or JURIS[pool.region] in pol.allowed_jurisdictions
        assert pol.required_certifications <= pool.certifications
        assert pool.purchase != "spot" or pol.spot_allowed
    for pid, gpus in used.items():
        assert gpus <= pools[pid].capacity_gpus + pools[pid].procurable_gpus, pid
    for name, slots in placed.items():
        dep = deps[name]
        total = sum(n for _, n in slots)
        assert total <= dep.target_replicas
        spot = sum(n for p, n in slots if pools[p].purchase == "spot")
        assert spot <= math.floor(dep.policy.max_spot_fraction * dep.target_replicas + 1e-9)
        provs = {pools[p].provider for p, _ in slots}
        regions = {pools[p].region for p, _ in slots}
        assert len(provs) >= min(dep.policy.min_distinct_providers, total)
        assert len(regions) >= min(dep.policy.min_distinct_regions, total)
    missing = sum(d.target_replicas for d in inp.deployments) - sum(
        a.replicas for a in result.assignments
    )
    assert missing == sum(u.replicas for u in result.unplaced)


@SETTINGS
@given(pools(), deployments())
def test_constraints_hold_and_no_pool_is_overcommitted(ps, ds):
    inp = make_input(ps, ds)
    check_invariants(inp, place(inp))


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
    check_invariants(after_inp, after)
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
    check_invariants(dataclasses.replace(new_inp, current=first.assignments), result)
    assert replan(result, new_inp).changes == ()  # re-planning the same input is stable
