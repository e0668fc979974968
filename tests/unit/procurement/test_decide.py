"""The pure procurement decision: scenarios with small builders, then invariants."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from controlplane.procurement.core import Acquire, Release, decide, instance_key

from .builders import NOW, make_instance, make_pool


def acquires(decision) -> list[Acquire]:
    return [a for a in decision.actions if isinstance(a, Acquire)]


def releases(decision) -> list[Release]:
    return [a for a in decision.actions if isinstance(a, Release)]


def test_missing_gpus_are_acquired_in_whole_instances():
    d = decide([make_pool(gpi=8)], [make_instance(gpus=8)], {"p": 20}, NOW)
    assert [(a.pool_id, a.count, a.cluster_id) for a in acquires(d)] == [("p", 2, "c")]


def test_requested_instances_count_so_a_second_plan_asks_for_nothing():
    held = [make_instance(state="requested"), make_instance(state="running")]
    assert decide([make_pool()], held, {"p": 16}, NOW).actions == ()


def test_quota_caps_what_is_asked_and_draining_instances_still_use_quota():
    pool = make_pool(limit_gpus=24)
    held = [make_instance(), make_instance(state="draining", drain_deadline=NOW + timedelta(1))]
    d = decide([pool], held, {"p": 32}, NOW)
    assert [a.count for a in acquires(d)] == [1]  # 24 - 16 held = one more instance
    full = decide([make_pool(limit_gpus=16)], held, {"p": 32}, NOW)
    assert acquires(full) == [] and full.blocked == {"p": "quota_full"}


def test_blocked_pools_get_nothing_and_say_why():
    for why in ("exhausted", "quota_exceeded", "failing", "outage"):
        d = decide([make_pool(blocked=why)], [], {"p": 8}, NOW)
        assert d.actions == () and d.blocked == {"p": why}


def test_idle_instances_are_released_only_after_the_scale_down_delay():
    fresh = make_instance(idle_since=NOW - timedelta(seconds=299))
    d = decide([make_pool()], [fresh], {}, NOW)
    assert releases(d) == [] and d.idle == {fresh.id}
    old = make_instance(idle_since=NOW - timedelta(seconds=300))
    d = decide([make_pool()], [old], {}, NOW)
    assert [(r.instance_id, r.reason) for r in releases(d)] == [(old.id, "idle")]


def test_an_instance_that_just_became_idle_starts_its_clock_instead_of_going():
    inst = make_instance(idle_since=None)
    d = decide([make_pool()], [inst], {"p": 0}, NOW)
    assert releases(d) == [] and d.idle == {inst.id}


def test_idle_prefers_instances_without_replicas_then_the_newest():
    busy = make_instance(busy=True, created_at=NOW - timedelta(minutes=1))
    old = make_instance(created_at=NOW - timedelta(hours=5))
    new = make_instance(created_at=NOW - timedelta(hours=2))
    d = decide([make_pool()], [busy, old, new], {"p": 16}, NOW)
    assert d.idle == {new.id}


def test_only_whole_surplus_instances_are_idle():
    d = decide([make_pool()], [make_instance(), make_instance()], {"p": 9}, NOW)
    assert d.idle == frozenset()


def test_reserved_instances_are_never_released_for_idleness_and_idle_gpus_are_reported():
    pool = make_pool(purchase="reserved", limit_gpus=32)
    held = [make_instance(idle_since=NOW - timedelta(days=3)) for _ in range(4)]
    d = decide([pool], held, {"p": 8}, NOW)
    assert releases(d) == []
    assert d.idle_reserved_gpus == {"p": 24}


def test_drained_instances_go_at_their_deadline():
    due = make_instance(state="draining", drain_deadline=NOW)
    later = make_instance(state="draining", drain_deadline=NOW + timedelta(seconds=1))
    d = decide([make_pool()], [due, later], {}, NOW)
    assert [r.instance_id for r in releases(d)] == [due.id]


def test_draining_capacity_is_replaced():
    leaving = make_instance(state="draining", drain_deadline=NOW + timedelta(minutes=2))
    d = decide([make_pool()], [leaving], {"p": 8}, NOW)
    assert [a.count for a in acquires(d)] == [1]


def test_an_outage_keeps_unhealthy_instances_and_stops_replacement():
    sick = make_instance(state="draining", health="unhealthy", drain_deadline=NOW)
    d = decide([make_pool(blocked="outage")], [sick], {"p": 8}, NOW)
    assert d.actions == () and d.blocked == {"p": "outage"}


def test_pools_missing_from_wanted_use_nothing():
    inst = make_instance(idle_since=NOW - timedelta(hours=1))
    d = decide([make_pool()], [inst], {"other": 8}, NOW)
    assert [r.instance_id for r in releases(d)] == [inst.id]


def test_instance_keys_are_stable_per_request_and_portable():
    assert instance_key("task-1", 0) == instance_key("task-1", 0)
    assert instance_key("task-1", 0) != instance_key("task-1", 1)
    assert len(instance_key("x", 0)) <= 40 and instance_key("x", 0).islower()


@given(
    purchase=st.sampled_from(["reserved", "on_demand", "spot"]),
    gpi=st.sampled_from([1, 2, 8]),
    held=st.lists(
        st.tuples(st.sampled_from(["requested", "running", "draining"]), st.integers(0, 1000)),
        max_size=8,
    ),
    wanted=st.integers(0, 80),
    limit=st.one_of(st.none(), st.integers(0, 80)),
)
def test_invariants(purchase, gpi, held, wanted, limit):
    pool = make_pool(purchase=purchase, gpi=gpi, limit_gpus=limit)
    insts = [
        make_instance(
            state=s,
            gpus=gpi,
            idle_since=NOW - timedelta(seconds=age),
            drain_deadline=NOW + timedelta(seconds=1) if s == "draining" else None,
        )
        for s, age in held
    ]
    d = decide([pool], insts, {"p": wanted}, NOW)
    active = sum(i.gpus for i in insts if i.state != "draining")
    bought = sum(a.count for a in acquires(d)) * gpi
    if purchase == "reserved":
        assert releases(d) == []
    if limit is not None:  # never above quota / commitment
        assert bought + sum(i.gpus for i in insts) <= max(limit, sum(i.gpus for i in insts))
    if bought:  # buys only what is missing, and releases nothing in the same pool
        assert active < wanted and releases(d) == []
        assert active + bought - gpi < wanted
    released = {r.instance_id for r in releases(d)}
    assert active - sum(i.gpus for i in insts if i.id in released) >= min(wanted, active)
