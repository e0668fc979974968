"""Placement scenarios, each a short story about one rule of the engine."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane.placement import Cluster, PlacementInputError, place, replan
from tests.unit.placement.builders import make_deployment, make_input, make_pool, replicas_by_pool
from tests.unit.placement.rules import check_rules


def test_residency_restricted_deployment_stays_in_its_jurisdiction_even_when_dearer():
    cheap_us = make_pool("aws-us-h100", price=1.0, capacity=64)
    dear_de = make_pool("aws-de-h100", region="aws:eu-central-1", price=5.0, capacity=64)
    eu_only = make_deployment(
        "eu-chat", gpus=8, replicas=3, allowed_jurisdictions=frozenset({"DE"})
    )

    result = place(make_input([cheap_us, dear_de], [eu_only]))

    assert replicas_by_pool(result, "eu-chat") == {"aws-de-h100": 3}


def test_reserved_fills_before_spot_and_spot_before_on_demand():
    reserved = make_pool("res", purchase="reserved", capacity=8, price=2.5)
    spot = make_pool(
        "spot", purchase="spot", capacity=0, procurable=16, price=1.2, interruption_rate=0.1
    )
    on_demand = make_pool("od", capacity=0, procurable=64, price=3.0)
    dep = make_deployment("chat", gpus=8, replicas=4, spot_allowed=True, max_spot_fraction=0.5)

    result = place(make_input([reserved, spot, on_demand], [dep]))

    assert replicas_by_pool(result, "chat") == {"res": 1, "spot": 2, "od": 1}
    bought = {p.pool: p.gpus for p in result.procurement}
    assert bought == {"spot": 16, "od": 8}


def test_losing_a_provider_keeps_a_replica_of_each_two_provider_deployment():
    pools = [
        make_pool("aws-a", provider="aws", capacity=32, price=2.0),
        make_pool("gcp-a", provider="gcp", region="gcp:us-central1", capacity=32, price=3.0),
        make_pool("lambda-a", provider="lambda", region="lambda:us-tx", capacity=32, price=2.5),
    ]
    deps = [
        make_deployment(f"d{i}", gpus=2, replicas=3, min_distinct_providers=2) for i in range(4)
    ]
    result = place(make_input(pools, deps))
    for dep in deps:
        by_provider = {p.split("-")[0] for p in replicas_by_pool(result, dep.name)}
        assert len(by_provider) >= 2, dep.name

    without_aws = make_input(pools[1:], deps, current=result.assignments)
    after = place(without_aws)
    for dep in deps:
        assert sum(replicas_by_pool(after, dep.name).values()) >= 1


def test_explanation_names_the_binding_certification_constraint():
    pools = [
        make_pool("aws-us-east-1-h100-od", capacity=8, certifications=frozenset({"HIPAA"})),
        make_pool(
            "lambda-us-tx",
            provider="lambda",
            region="lambda:us-tx",
            capacity=8,
            certifications=frozenset({"HIPAA"}),
        ),
        make_pool("cheap-no-hipaa", capacity=64, price=1.0),
    ]
    filler = make_deployment(
        "filler", gpus=8, replicas=2, priority=5, required_certifications=frozenset({"HIPAA"})
    )
    triage = make_deployment(
        "triage-llm",
        gpus=8,
        replicas=1,
        allowed_jurisdictions=frozenset({"US", "CA"}),
        required_certifications=frozenset({"HIPAA"}),
    )

    result = place(make_input(pools, [filler, triage]))

    (unplaced,) = result.unplaced
    assert unplaced.deployment == "triage-llm"
    assert unplaced.constraint == "capacity"
    assert "HIPAA in CA or US" in unplaced.reason
    assert "`aws-us-east-1-h100-od`" in unplaced.reason and "`lambda-us-tx`" in unplaced.reason
    assert "relax required_certifications" in unplaced.reason


def test_explanation_when_no_pool_passes_a_static_constraint():
    result = place(
        make_input(
            [make_pool("us")], [make_deployment("eu", allowed_jurisdictions=frozenset({"DE"}))]
        )
    )
    (u,) = result.unplaced
    assert u.constraint == "allowed_jurisdictions"
    assert "to fix: relax allowed_jurisdictions" in u.reason


def test_higher_priority_displaces_lower_priority_and_it_is_reported():
    pool = make_pool("only", capacity=16)
    low = make_deployment("batch", gpus=8, replicas=2, priority=0)
    first = place(make_input([pool], [low]))
    high = make_deployment("prod", gpus=8, replicas=1, priority=10)

    result = place(make_input([pool], [low, high], current=first.assignments))

    assert replicas_by_pool(result, "prod") == {"only": 1}
    (u,) = result.unplaced
    assert (u.deployment, u.displaced_by, u.constraint) == ("batch", "prod", "priority")
    assert any(c.kind == "remove" and c.deployment == "batch" for c in result.changes)


def test_unhealthy_cluster_receives_nothing_and_its_replicas_move():
    pools = [make_pool("a", capacity=16, price=1.0), make_pool("b", capacity=16, price=2.0)]
    dep = make_deployment("chat", gpus=8, replicas=2)
    first = place(make_input(pools, [dep]))
    assert replicas_by_pool(first, "chat") == {"a": 2}
    inp = make_input(pools, [dep], current=first.assignments)
    down = dataclasses.replace(
        inp, clusters=(Cluster("c-a", ("a",), "unhealthy"), Cluster("c-b", ("b",)))
    )
    result = place(down)
    assert replicas_by_pool(result, "chat") == {"b": 2}
    assert {c.kind for c in result.changes} == {"move"}


def test_stable_input_moves_nothing_and_small_change_moves_little():
    pools = [make_pool(f"p{i}", capacity=16, price=1.0 + i / 10) for i in range(4)]
    deps = [make_deployment(f"d{i}", gpus=2, replicas=3) for i in range(5)]
    first = place(make_input(pools, deps))
    again = place(make_input(pools, deps, current=first.assignments))
    assert again.changes == ()
    bigger = [*deps[:-1], dataclasses.replace(deps[-1], wanted_replicas=4)]
    inc = replan(first, make_input(pools, bigger))
    assert [(c.kind, c.deployment, c.replicas) for c in inc.changes] == [("add", "d4", 1)]


def test_an_incremental_replan_places_what_was_short_once_a_change_frees_room():
    pool = make_pool("p", capacity=8)
    big = make_deployment("big", gpus=2, replicas=4, priority=200)
    short = make_deployment("short", gpus=2, replicas=2)
    first = place(make_input([pool], [big, short]))
    assert replicas_by_pool(first, "short") == {}
    # a change that frees nothing leaves it short (and is not retried)
    other = make_deployment("other", gpus=2, replicas=1)
    grown = replan(first, make_input([pool], [big, short, other]))
    assert replicas_by_pool(grown, "short") == {} and grown.changes == ()
    smaller = dataclasses.replace(big, wanted_replicas=2, min_replicas=2)
    freed = replan(grown, make_input([pool], [smaller, short, other]))
    assert replicas_by_pool(freed, "big") == {"p": 2}
    assert (
        sum(replicas_by_pool(freed, "short").values())
        + sum(replicas_by_pool(freed, "other").values())
        == 2
    )  # the 4 GPUs freed go to the two left short, by priority then order


def test_cost_per_hour_counts_list_prices():
    result = place(make_input([make_pool("p", price=2.0)], [make_deployment("x", gpus=4)]))
    assert result.cost_per_hour == {"x": 8.0}
    assert result.total_cost_per_hour == 8.0


def test_bad_input_says_what_to_fix():
    with pytest.raises(PlacementInputError, match="unknown region"):
        place(make_input([make_pool("p", region="nowhere")], []))


def test_second_provider_is_freed_by_moving_a_flexible_deployment():
    aws = make_pool("aws-h100", capacity=16, price=2.0)
    gcp = make_pool("gcp-h100", provider="gcp", region="gcp:us-central1", capacity=8, price=0.5)
    aws_dear = make_pool("aws-h100-dear", capacity=8, price=2.5)
    flexible = make_deployment("flex", gpus=8, replicas=1, priority=1)
    spread = make_deployment("ha-chat", gpus=8, replicas=2, min_distinct_providers=2)

    result = place(make_input([aws, gcp, aws_dear], [flexible, spread]))

    assert result.unplaced == ()
    assert replicas_by_pool(result, "ha-chat") == {"aws-h100": 1, "gcp-h100": 1}
    assert replicas_by_pool(result, "flex") == {"aws-h100": 1}


def test_the_engine_prints_nothing(capfd):
    pools = [make_pool("a", capacity=16), make_pool("b", capacity=16, gpus_per_instance=4)]
    deps = [make_deployment("x", gpus=8, replicas=1), make_deployment("y", gpus=4, replicas=3)]
    place(make_input(pools, deps))
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_mixed_replica_sizes_pack_whole_replicas_into_odd_pools():
    # 24 GPUs in pools of 13 and 11 for 25 GPUs of demand: only one GPU need stay unplaced
    pools = [make_pool("a", capacity=13, price=1.0), make_pool("b", capacity=11, price=2.0)]
    deps = [
        make_deployment("big", gpus=8, replicas=1),
        make_deployment("mid", gpus=4, replicas=2),
        make_deployment("small", gpus=2, replicas=3),
        make_deployment("tiny", gpus=1, replicas=3),
    ]

    result = place(make_input(pools, deps))

    assert [(u.deployment, u.replicas) for u in result.unplaced] == [("tiny", 1)]


def test_deployments_of_one_spread_class_share_the_scarce_second_provider():
    gcp = make_pool("gcp", provider="gcp", region="gcp:us-central1", capacity=32, price=1.0)
    aws = make_pool("aws", capacity=64, price=2.0)
    deps = [
        make_deployment(f"ha{i}", gpus=8, replicas=3, min_distinct_providers=2) for i in range(4)
    ]

    result = place(make_input([gcp, aws], deps))

    assert result.unplaced == ()
    for dep in deps:
        assert replicas_by_pool(result, dep.name) == {"aws": 2, "gcp": 1}


def test_higher_priority_displaces_for_every_replica_it_needs():
    # repair places one replica per room it makes and must go on for the next: prod's two
    # replicas each evict one of batch's (the first pass left prod with none)
    pool = make_pool("only", capacity=16)
    low = make_deployment("batch", gpus=8, replicas=2, priority=0)
    first = place(make_input([pool], [low]))
    high = make_deployment("prod", gpus=8, replicas=2, priority=10)

    result = place(make_input([pool], [low, high], current=first.assignments))

    assert replicas_by_pool(result, "prod") == {"only": 2}
    assert [(u.deployment, u.replicas, u.constraint) for u in result.unplaced] == [
        ("batch", 2, "priority")
    ]


def test_higher_priority_displaces_lower_priority_from_a_dear_pool_past_the_cheap_ones():
    # the 34 cheap pools hold `mid` (prod's own priority: not evictable); batch (lower)
    # sits in the dearest pool. Repair used to look for victims in the 32 cheapest pools
    # only, found none, and left prod unplaced while batch ran
    cheap = [make_pool(f"c{i:02d}", capacity=8, price=1.0) for i in range(34)]
    dear = make_pool("dear", capacity=8, price=9.0)
    mid = make_deployment("mid", gpus=8, replicas=34, priority=1)
    batch = make_deployment("batch", gpus=8, replicas=1, priority=0)
    first = place(make_input([*cheap, dear], [mid, batch]))
    assert replicas_by_pool(first, "batch") == {"dear": 1}
    prod = make_deployment("prod", gpus=8, replicas=1, priority=1)

    result = place(make_input([*cheap, dear], [mid, batch, prod], current=first.assignments))

    assert replicas_by_pool(result, "prod") == {"dear": 1}
    assert sum(replicas_by_pool(result, "mid").values()) == 34
    assert [(u.deployment, u.displaced_by, u.constraint) for u in result.unplaced] == [
        ("batch", "prod", "priority")
    ]


def test_a_deployment_short_of_providers_displaces_lower_priority_in_a_new_one():
    # prod asks for two providers; aws has room, gcp is full of batch (lower priority,
    # allowed only there). prod takes aws, then evicts batch to reach gcp, instead of
    # being trimmed to one provider's worth while batch keeps running
    aws = make_pool("aws", capacity=8, price=1.0)
    gcp = make_pool("gcp", provider="gcp", region="gcp:us-central1", capacity=8, price=1.0)
    batch = make_deployment(
        "batch", gpus=8, replicas=1, allowed_regions=frozenset({"gcp:us-central1"})
    )
    first = place(make_input([aws, gcp], [batch]))
    assert replicas_by_pool(first, "batch") == {"gcp": 1}
    prod = make_deployment("prod", gpus=4, replicas=2, priority=10, min_distinct_providers=2)

    result = place(make_input([aws, gcp], [batch, prod], current=first.assignments))

    assert replicas_by_pool(result, "prod") == {"aws": 1, "gcp": 1}
    assert [(u.deployment, u.displaced_by, u.constraint) for u in result.unplaced] == [
        ("batch", "prod", "priority")
    ]


def test_an_evicted_replica_that_finds_a_new_pool_is_neither_doubled_nor_reported_lost():
    # prod (only region a) evicts batch from pool a; batch's own turn comes later and
    # re-places it in b. It then misses nothing: re-homing must not add a second replica
    # (b has room for two) nor report the first as displaced
    a = make_pool("a", capacity=8, price=1.0)
    b = make_pool("b", region="aws:ca-central-1", capacity=16, price=2.0)
    batch = make_deployment("batch", gpus=8, replicas=1, priority=0)
    first = place(make_input([a, b], [batch]))
    assert replicas_by_pool(first, "batch") == {"a": 1}
    prod = make_deployment(
        "prod", gpus=8, replicas=1, priority=1, allowed_regions=frozenset({"aws:us-east-1"})
    )
    inp = make_input([a, b], [batch, prod], current=first.assignments)

    result = place(inp)

    check_rules(inp, result)
    assert replicas_by_pool(result, "prod") == {"a": 1}
    assert replicas_by_pool(result, "batch") == {"b": 1}
    assert result.unplaced == ()


def test_a_second_eviction_does_not_break_the_victims_spread():
    # ha spans two providers with two replicas each; prod (only aws) needs both of ha's
    # aws slots: the first eviction leaves ha on two providers, the second would leave it
    # on gcp alone (and trim it to one replica): repair stops at the first
    aws = make_pool("aws", capacity=8, price=1.0)
    gcp = make_pool("gcp", provider="gcp", region="gcp:us-central1", capacity=8, price=1.0)
    ha = make_deployment("ha", gpus=4, replicas=4, min_distinct_providers=2)
    first = place(make_input([aws, gcp], [ha]))
    assert replicas_by_pool(first, "ha") == {"aws": 2, "gcp": 2}
    prod = make_deployment(
        "prod", gpus=4, replicas=2, priority=10, allowed_regions=frozenset({"aws:us-east-1"})
    )

    result = place(make_input([aws, gcp], [ha, prod], current=first.assignments))

    assert replicas_by_pool(result, "prod") == {"aws": 1}
    assert replicas_by_pool(result, "ha") == {"aws": 1, "gcp": 2}
