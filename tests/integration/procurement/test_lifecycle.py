"""After acquire: spot notices, bad nodes and outages, idle release, reserved capacity,
offers and provider construction."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.contracts import NodeUnhealthy, SpotInterruptionNoticed
from controlplane.db import models as m
from controlplane.db.session import transaction
from controlplane.procurement import facts, tasks
from controlplane.procurement.adapters import provider_config
from controlplane.procurement.core import Acquire, Release
from controlplane.procurement.store import plan_procurement
from controlplane.services.observed import DbSink
from providers.base import InvalidRequest

from .conftest import Fleet


def plan(deps, wanted: dict[str, int]) -> list[Any]:
    with transaction(deps.factory) as s:
        return plan_procurement(s, wanted, deps.clock(), deps.policy)


def carry_out(deps, actions: list[Any]) -> None:
    for a in actions:
        if isinstance(a, Acquire):
            tasks.acquire_run(deps, a.pool_id, a.count, a.request_id, a.cluster_id)
        else:
            tasks.release_run(deps, a.instance_id, a.reason)


def instances(factory, pool_id: str) -> list[m.Instance]:
    with factory() as s:
        query = select(m.Instance).where(m.Instance.pool_id == pool_id)
        return list(s.scalars(query.order_by(m.Instance.created_at)))


def instance(factory, id_: str) -> m.Instance:
    with factory() as s:
        return s.get_one(m.Instance, id_)


def events(factory, type_: str) -> list[m.Event]:
    with factory() as s:
        return list(s.scalars(select(m.Event).where(m.Event.type == type_)))


def test_spot_notice_drains_replans_within_a_second_and_is_replaced(deps, fleet, local, sent):
    pool = fleet.pool(purchase="spot", gpi=8)
    carry_out(deps, plan(deps, {pool: 16}))
    first, second = instances(deps.factory, pool)
    local.interrupt(first.provider_instance_id, notice=timedelta(minutes=2))

    started = time.perf_counter()
    assert tasks.poll_interruptions_run(deps) == [first.provider_instance_id]
    assert sent.replans == ["spot_interruption_noticed"]
    assert time.perf_counter() - started < 1.0
    drained = instance(deps.factory, first.id)
    assert drained.state == "draining"
    assert drained.drain_deadline == deps.clock() + timedelta(minutes=2)
    (ev,) = events(deps.factory, "InstanceDraining")
    assert datetime.fromisoformat(ev.data["deadline"]) == drained.drain_deadline
    assert tasks.poll_interruptions_run(deps) == []  # a repeated notice changes nothing
    assert sent.replans == ["spot_interruption_noticed"]

    replacement = plan(deps, {pool: 16})  # the re-plan still wants 16 GPUs there
    assert [(a.kind, getattr(a, "count", None)) for a in replacement] == [("acquire", 1)]
    carry_out(deps, replacement)
    deps.clock.advance(120)
    assert [a.instance_id for a in plan(deps, {pool: 16})] == [first.id]
    assert instance(deps.factory, second.id).state == "running"


def test_the_agents_spot_fact_drains_the_instance(factory, deps, fleet, sent):
    pool = fleet.pool(purchase="spot")
    carry_out(deps, plan(deps, {pool: 8}))
    (inst,) = instances(factory, pool)
    sink = DbSink(factory)
    deadline = deps.clock() + timedelta(seconds=90)
    fact = SpotInterruptionNoticed(
        source="cluster/plane-1",
        cluster="plane-1",
        instance_id=str(inst.provider_instance_id),
        deadline=deadline,
    )
    assert sink._fact("plane-1", fact, deps.clock()) == "spot_interruption_noticed"
    inst = instance(factory, inst.id)
    assert (inst.state, inst.drain_deadline) == ("draining", deadline)


def test_a_spot_deadline_far_ahead_is_held_to_the_pools_notice(factory, deps, fleet, sent):
    """A plane's clock far ahead (or a forged fact) drained the instance for good: billed
    beside its replacement, never released."""
    pool = fleet.pool(purchase="spot")
    carry_out(deps, plan(deps, {pool: 8}))
    (inst,) = instances(factory, pool)
    fact = SpotInterruptionNoticed(
        source="cluster/plane-1",
        cluster="plane-1",
        instance_id=str(inst.provider_instance_id),
        deadline=datetime(9999, 1, 1, tzinfo=deps.clock().tzinfo),
    )
    assert DbSink(factory)._fact("plane-1", fact, deps.clock()) == "spot_interruption_noticed"
    inst = instance(factory, inst.id)
    notice = timedelta(seconds=deps.policy.default_notice_s)  # the pool sets none
    assert inst.state == "draining" and inst.drain_deadline == deps.clock() + notice


def test_a_plane_cannot_drain_or_cordon_another_planes_instance(factory, deps, fleet, sent):
    """Notices name an instance by id: one held for another cluster (or a made-up id) is
    refused and counted, and the instance is left as it was (before, plane-2 could drain
    plane-1's machine with a deadline in the past, and have it released)."""
    pool = fleet.pool(purchase="spot")
    carry_out(deps, plan(deps, {pool: 8}))
    (inst,) = instances(factory, pool)
    before = (inst.state, inst.health, inst.drain_deadline)
    assert before[0] == "running"
    with transaction(factory) as s:
        s.add(m.Cluster(name="plane-2", region_id=fleet.region_id, state="healthy"))
    sink = DbSink(factory)
    ref = str(inst.provider_instance_id)
    past = datetime(1, 1, 1, tzinfo=deps.clock().tzinfo)
    other = {"source": "cluster/plane-2", "cluster": "plane-2"}
    for fact in (
        SpotInterruptionNoticed.model_validate({**other, "instance_id": ref, "deadline": past}),
        NodeUnhealthy.model_validate({**other, "instance_id": ref, "reason": "forged"}),
        SpotInterruptionNoticed.model_validate({**other, "instance_id": "i-nobody"}),
    ):
        assert sink._checked_fact("plane-2", fact, deps.clock()) == (None, ["instance_not_given"])
    held = instance(factory, inst.id)
    assert (held.state, held.health, held.drain_deadline) == before
    # its own plane's notice still counts, and a deadline already past means now
    own = SpotInterruptionNoticed(source="cluster/plane-1", cluster="plane-1",
                                  instance_id=ref, deadline=past)  # fmt: skip
    assert sink._fact("plane-1", own, deps.clock()) == "spot_interruption_noticed"
    assert instance(factory, inst.id).drain_deadline == deps.clock()


def test_a_bad_node_is_replaced_but_an_outage_stops_replacement(factory, deps, fleet, sent):
    pool = fleet.pool(gpi=8)
    carry_out(deps, plan(deps, {pool: 16}))
    a, b = instances(factory, pool)
    sink = DbSink(factory)

    def unhealthy(inst: m.Instance) -> None:
        fact = NodeUnhealthy(
            source="cluster/plane-1",
            cluster="plane-1",
            instance_id=str(inst.provider_instance_id),
            reason="xid 79",
        )
        sink._fact("plane-1", fact, deps.clock())

    unhealthy(a)  # one bad node: cordoned, drained, replaced
    sick = instance(factory, a.id)
    assert (sick.health, sick.state) == ("unhealthy", "draining")
    carry_out(deps, plan(deps, {pool: 16}))
    assert len(instances(factory, pool)) == 3

    unhealthy(b)  # 2 of 3 at once: an outage, not a bad node
    with factory() as s:
        assert "outage" in s.get_one(m.Pool, pool).status
    assert len(events(factory, "PoolOutageSuspected")) == 1
    deps.clock.advance(600)
    assert plan(deps, {pool: 16}) == []  # no replacement, no release of the sick nodes
    with factory() as s:
        assert s.get_one(m.Pool, pool).status["blocked"] == "outage"

    with transaction(factory) as s:  # the operator, once the provider recovered
        facts.clear_outage(s, pool)
    after = plan(deps, {pool: 16})  # the sick nodes go (past their drain), one replacement
    assert [x.count for x in after if isinstance(x, Acquire)] == [1]
    assert {x.instance_id for x in after if isinstance(x, Release)} == {a.id, b.id}


def test_idle_instances_go_after_the_deployments_scale_down_delay(deps, fleet, local):
    pool = fleet.pool(gpi=8)
    fleet.deployment_on(pool, replicas=0, delay_s=600)
    carry_out(deps, plan(deps, {pool: 16}))
    assert plan(deps, {pool: 8}) == []  # one instance idle: its clock starts
    deps.clock.advance(599)
    assert plan(deps, {pool: 8}) == []
    deps.clock.advance(1)
    actions = plan(deps, {pool: 8})
    assert [(type(a), a.reason) for a in actions] == [(Release, "idle")]
    carry_out(deps, actions)
    assert len(local.list_instances()) == 1


def test_an_idle_release_overtaken_by_load_coming_back_releases_nothing(deps, fleet, local):
    """The release task waited in the queue while the next plan wanted the instance again:
    it used to terminate it all the same (and a replica placed on it meanwhile)."""
    pool = fleet.pool(gpi=8)
    fleet.deployment_on(pool, replicas=0, delay_s=600)
    carry_out(deps, plan(deps, {pool: 16}))
    plan(deps, {pool: 8})
    deps.clock.advance(600)
    queued = plan(deps, {pool: 8})
    assert [(type(a), a.reason) for a in queued] == [(Release, "idle")]
    assert plan(deps, {pool: 16}) == []  # load is back before the task runs
    carry_out(deps, queued)
    assert len(local.list_instances()) == 2
    assert {i.state for i in instances(deps.factory, pool)} == {"running"}


def test_an_idle_release_the_provider_throttled_goes_on_when_retried(
    deps, fleet, local, monkeypatch
):
    """The first try marked the row releasing, then the provider throttled; the retry found
    it "no longer idle" (not running) and did nothing: the instance stayed billed until a
    sweep minutes later."""
    from providers.base import Throttled

    pool = fleet.pool(gpi=8)
    fleet.deployment_on(pool, replicas=0, delay_s=600)
    carry_out(deps, plan(deps, {pool: 16}))
    plan(deps, {pool: 8})
    deps.clock.advance(600)
    [release] = plan(deps, {pool: 8})
    real = type(local).delete_instance

    def throttled(self, instance_id: str) -> None:
        raise Throttled("rate limited")

    monkeypatch.setattr(type(local), "delete_instance", throttled)
    first = tasks.release_run(deps, release.instance_id, release.reason)
    assert first.retry and instance(deps.factory, release.instance_id).state == "releasing"
    tasks.release_run(deps, release.instance_id, release.reason)  # throttled again
    [failed] = events(deps.factory, "InstanceReleaseFailed")  # once per distinct error
    assert "Throttled" in failed.message and "billed" in failed.message
    monkeypatch.setattr(type(local), "delete_instance", real)
    tasks.release_run(deps, release.instance_id, release.reason)  # Celery's retry
    assert instance(deps.factory, release.instance_id).state == "released"
    assert len(local.list_instances()) == 1


def test_load_coming_back_stops_the_idle_clock(deps, fleet):
    pool = fleet.pool(gpi=8)
    carry_out(deps, plan(deps, {pool: 8}))
    plan(deps, {pool: 0})
    deps.clock.advance(200)
    plan(deps, {pool: 8})
    deps.clock.advance(200)
    assert plan(deps, {pool: 0}) == []  # the clock restarted at 200 s


def test_reserved_capacity_is_never_released_and_its_idle_gpus_are_reported(deps, fleet):
    pool = fleet.pool(purchase="reserved", gpi=8, committed_gpus=32, capacity_reservation_id="cr-1")
    carry_out(deps, plan(deps, {pool: 32}))
    for _ in range(3):
        deps.clock.advance(86_400)
        assert plan(deps, {pool: 8}) == []
    with deps.factory() as s:
        assert s.get_one(m.Pool, pool).status["idle_reserved_gpus"] == 24


def test_offers_and_spot_prices_are_refreshed_into_pools(factory, deps, fleet, tmp_path):
    from providers.local import LocalProvider

    priced = LocalProvider(gpus_total=16, price_per_gpu_hour=2.0, state_path=tmp_path / "p.json")
    spot = fleet.pool(purchase="spot", gpi=4, quota_gpus=16)
    deps.providers = lambda row: priced
    assert tasks.refresh_offers_run(deps) == 1
    with factory() as s:
        status = s.get_one(m.Pool, spot).status
    assert status["offer"]["instance_type"] == "local-4gpu" and status["offer"]["available"]
    assert status["spot_price_per_gpu_hour"] == pytest.approx(0.8)
    assert status["spot_available_gpus"] == 16


def test_providers_are_built_from_their_row(monkeypatch, tmp_path):
    row = m.Provider(
        name="lab", kind="local", provider_class="neocloud", credentials_ref="env:LAB_PROVIDER"
    )
    monkeypatch.setenv("LAB_PROVIDER", json.dumps({"gpus_total": 4}))
    assert provider_config(row, tmp_path) == {
        "gpus_total": 4,
        "state_path": str(tmp_path / "providers/lab.json"),
    }
    row.credentials_ref = "vault:secret/lab"
    with pytest.raises(InvalidRequest, match="env:NAME or file:/path"):
        provider_config(row, tmp_path)


def test_one_provider_down_or_broken_does_not_stop_the_sweeps_for_the_others(
    deps, fleet, local, sent
):
    """Provider 1's API is unreachable (a raw transport error its adapter let through):
    provider 2's spot notice still drains its instance, and its instances are still listed;
    before, the first provider's error ended each sweep for every provider after it."""
    with transaction(deps.factory) as s:
        other = m.Provider(name="local-2", kind="local", provider_class="neocloud")
        s.add(other)
        s.flush()
        region = m.Region(name="local-2-local", provider_id=other.id, code="local",
                          jurisdiction="US", latitude=0.0, longitude=0.0)  # fmt: skip
        s.add(region)
        s.flush()
        second = Fleet(deps.factory, other.id, region.id, fleet.gpu_type_id, fleet.cluster_id, 10)
    broken_pool, pool = fleet.pool(purchase="spot", gpi=8), second.pool(purchase="spot", gpi=8)
    carry_out(deps, plan(deps, {pool: 8, broken_pool: 8}))

    class Unreachable:
        kind = "local"

        def __getattr__(self, name: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                raise ConnectionError("connection refused")

            return call

    deps.providers = lambda row: Unreachable() if row.name == "local-1" else local
    (held,) = instances(deps.factory, pool)
    local.interrupt(held.provider_instance_id, notice=timedelta(minutes=2))
    assert tasks.poll_interruptions_run(deps) == [held.provider_instance_id]
    assert instance(deps.factory, held.id).state == "draining"
    assert tasks.refresh_offers_run(deps) >= 1  # provider 2's pool
    tasks.reconcile_run(deps)  # provider 1 skipped, not raised


def test_a_sweep_runs_one_at_a_time(deps, fleet, local):
    """A run still waiting on a slow provider: the next one (every 0.5 s for notices) returns
    at once instead of holding a second worker and asking the provider again."""
    from controlplane.procurement import store

    pool = fleet.pool(purchase="spot", gpi=8)
    carry_out(deps, plan(deps, {pool: 8}))
    asked: list[str] = []

    class Counting:
        kind = "local"

        def __getattr__(self, name: str) -> Any:
            asked.append(name)
            return getattr(local, name)

    deps.providers = lambda row: Counting()
    for sweep, run in (("interruptions", tasks.poll_interruptions_run),
                       ("offers", tasks.refresh_offers_run),
                       ("reconcile", tasks.reconcile_run)):  # fmt: skip
        with store.key_lock(deps.factory, f"sweep-{sweep}") as held:
            assert held
            run(deps)
        assert asked == [], sweep
    tasks.poll_interruptions_run(deps)
    assert asked == ["interruption_notices"]
