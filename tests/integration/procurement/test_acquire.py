"""Acquire: one instance per key however often a worker dies or retries; capacity, quota
and throttling errors each end the way procurement promises."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.db import models as m
from controlplane.db.session import transaction
from controlplane.procurement import tasks
from controlplane.procurement.core import Acquire
from controlplane.procurement.store import plan_procurement
from providers.base import InsufficientCapacity, PoolRef, Provider, QuotaExceeded, Throttled

from .conftest import make_deps, make_fleet, worker_app


class WorkerKilled(BaseException):
    """What a SIGKILL looks like from inside: nothing after it runs, no handler catches it."""


class Flaky:
    """A real provider whose create_instances can fail before, or die after, the real call."""

    def __init__(
        self, inner: Provider, before: Sequence[Exception] = (), die_after: int = 0
    ) -> None:
        self.inner, self.before, self.die_after = inner, list(before), die_after
        self.kind, self.creates = inner.kind, 0

    def create_instances(self, pool: PoolRef, count: int, idempotency_key: str) -> list[Any]:
        self.creates += 1
        if self.before:
            raise self.before.pop(0)
        made = self.inner.create_instances(pool, count, idempotency_key)
        if self.die_after:
            self.die_after -= 1
            raise WorkerKilled
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def rows(factory) -> list[m.Instance]:
    with factory() as s:
        return list(s.scalars(select(m.Instance).order_by(m.Instance.idempotency_key)))


def pool_status(factory, pool_id: str) -> dict[str, Any]:
    with factory() as s:
        return s.get_one(m.Pool, pool_id).status


def test_worker_killed_after_the_provider_call_reruns_into_the_same_instance(
    factory, fleet, local, sent, clock
):
    pool = fleet.pool()
    flaky = Flaky(local, die_after=1)
    d = make_deps(factory, flaky, sent, clock)
    with pytest.raises(WorkerKilled):
        tasks.acquire_run(d, pool, 1, "task-1")
    (row,) = rows(factory)  # the key was committed before the call
    assert row.state == "requested" and row.provider_instance_id is None
    assert len(local.list_instances()) == 1

    redelivered = worker_app(d).tasks[tasks.ACQUIRE]  # same task id, same key
    result = redelivered.run(pool, 1, request_id="task-1")
    (instance,) = local.list_instances()
    assert result["acquired"] == [instance.id]
    (row,) = rows(factory)
    assert (row.state, row.provider_instance_id, row.cluster_id) == (
        "running",
        instance.id,
        fleet.cluster_id,
    )
    assert flaky.creates == 2


def test_the_sweep_adopts_an_instance_whose_recording_was_lost(factory, fleet, local, sent, clock):
    pool = fleet.pool()
    d = make_deps(factory, Flaky(local, die_after=1), sent, clock)
    with pytest.raises(WorkerKilled):
        tasks.acquire_run(d, pool, 2, "task-2")
    counts = tasks.reconcile_run(make_deps(factory, local, sent, clock))
    assert counts["adopted"] == 1
    clock.advance(301)  # the second key was never sent: resumed with its own key
    assert tasks.reconcile_run(make_deps(factory, local, sent, clock))["resumed"] == 1
    assert len(local.list_instances()) == 2
    assert sorted(r.provider_instance_id or "" for r in rows(factory)) == sorted(
        i.id for i in local.list_instances()
    )


def test_the_sweep_gives_up_a_stale_request_of_a_blocked_pool(factory, fleet, local, sent, clock):
    """A blocked pool gets no new instances: a stale request was resumed all the same. It
    is given up (no longer counted as capacity on its way); the plan asks again later."""
    pool = fleet.pool()
    with pytest.raises(WorkerKilled):  # the second key is never sent
        tasks.acquire_run(make_deps(factory, Flaky(local, die_after=1), sent, clock), pool, 2, "t")
    tasks.reconcile_run(make_deps(factory, local, sent, clock))  # adopts the first
    clock.advance(200)
    no_more = Flaky(local, before=[InsufficientCapacity("no L4 left")])
    assert tasks.acquire_run(make_deps(factory, no_more, sent, clock), pool, 1, "u").error
    clock.advance(101)  # the request is stale; the pool is exhausted for 199 s more
    counts = tasks.reconcile_run(make_deps(factory, local, sent, clock))
    assert (counts["resumed"], counts["given_up"]) == (0, 1)
    assert len(local.list_instances()) == 1
    assert sorted(r.state for r in rows(factory)) == ["failed", "failed", "running"]
    given = next(r for r in rows(factory) if r.error and "not resumed" in r.error)
    assert "the pool is blocked (exhausted)" in (given.error or "")
    clock.advance(200)  # after the block nothing is launched for it
    assert tasks.reconcile_run(make_deps(factory, local, sent, clock))["resumed"] == 0
    assert len(local.list_instances()) == 1


def test_plans_never_ask_twice_for_the_same_gpus(factory, fleet, local, sent, clock):
    pool = fleet.pool()
    with transaction(factory) as s:
        first = plan_procurement(s, {pool: 16}, clock())
    with transaction(factory) as s:
        second = plan_procurement(s, {pool: 16}, clock())
    assert [(a.pool_id, a.count) for a in first if isinstance(a, Acquire)] == [(pool, 2)]
    assert second == []
    tasks.dispatch(first, sent.send_task)
    ((name, kwargs),) = sent.calls
    assert name == "gpufleet.acquire"
    tasks.acquire_run(make_deps(factory, local, sent, clock), **kwargs)
    assert len(local.list_instances()) == 2 and len(rows(factory)) == 2


def test_capacity_error_exhausts_the_pool_and_asks_for_a_replan(factory, fleet, local, sent, clock):
    pool = fleet.pool()
    d = make_deps(factory, Flaky(local, before=[InsufficientCapacity("no L4 left")]), sent, clock)
    out = tasks.acquire_run(d, pool, 1, "task-3")
    assert out.error == "InsufficientCapacity" and not out.retry
    until = datetime.fromisoformat(pool_status(factory, pool)["exhausted_until"])
    assert until == clock() + timedelta(seconds=300)
    assert sent.calls == [("gpufleet.replan", {"reason": "capacity_exhausted"})]
    with transaction(factory) as s:  # cool-down: the plan asks this pool for nothing
        assert plan_procurement(s, {pool: 8}, clock()) == []
    clock.advance(301)
    with transaction(factory) as s:
        assert [getattr(a, "count", 0) for a in plan_procurement(s, {pool: 8}, clock())] == [1]


def test_quota_error_is_not_retried_in_a_loop(factory, fleet, local, sent, clock):
    pool = fleet.pool()
    dep = fleet.deployment_on(pool, replicas=3)
    flaky = Flaky(local, before=[QuotaExceeded("L4 quota is 16; raise it")] * 100)
    d = make_deps(factory, flaky, sent, clock)
    for _ in range(10):  # ten re-plans, each carrying its actions out at once
        with transaction(factory) as s:
            actions = plan_procurement(s, {pool: 24}, clock(), d.policy)
        for a in actions:
            if isinstance(a, Acquire):
                tasks.acquire_run(d, a.pool_id, a.count, a.request_id, a.cluster_id)
        clock.advance(5)
    assert flaky.creates == 1
    status = pool_status(factory, pool)
    assert "raise it" in status["quota_exceeded"]["message"]
    with factory() as s:
        assert s.get_one(m.Deployment, dep).status["procurement"]["reason"] == "quota_exceeded"
    assert sent.replans == ["quota_exceeded"]


def test_throttling_is_retried_with_the_same_key(factory, fleet, local, sent, clock):
    pool = fleet.pool()
    flaky = Flaky(local, before=[Throttled("slow down")])
    d = make_deps(factory, flaky, sent, clock)
    out = tasks.acquire_run(d, pool, 1, "task-4")
    assert out.retry and out.error == "Throttled"
    assert [r.state for r in rows(factory)] == ["requested"]
    assert tasks.acquire_run(d, pool, 1, "task-4").acquired
    assert len(local.list_instances()) == 1 and flaky.creates == 2


def test_aws_worker_killed_mid_call_makes_one_ec2_instance(factory, aws_provider, sent, clock):
    fleet = make_fleet(factory, kind="aws", region="us-east-1")
    pool = fleet.pool(purchase="on_demand", gpi=1, instance_type="g6e.xlarge")
    d = make_deps(factory, Flaky(aws_provider, die_after=1), sent, clock)
    with pytest.raises(WorkerKilled):
        tasks.acquire_run(d, pool, 1, "aws-task-1")
    out = tasks.acquire_run(make_deps(factory, aws_provider, sent, clock), pool, 1, "aws-task-1")
    (row,) = rows(factory)
    mine = [i for i in aws_provider.list_instances() if i.idempotency_key == row.idempotency_key]
    assert [i.id for i in mine] == out.acquired == [row.provider_instance_id]
    tasks.release_run(make_deps(factory, aws_provider, sent, clock), row.id)
    assert row.provider_instance_id not in {i.id for i in aws_provider.list_instances()}


def test_an_ec2_launch_whose_answer_is_lost_is_retried_into_the_same_instance(
    factory, aws_provider, ec2_shim, sent, clock
):
    """EC2 launched the instance and the answer never came (a read timeout, a dropped
    connection): the pool is not blocked for 30 minutes nor the key given up — which had
    the next plan buy a second instance while the first billed, unseen."""
    fleet = make_fleet(factory, kind="aws", region="us-east-1")
    pool = fleet.pool(purchase="on_demand", gpi=1, instance_type="g6e.xlarge")
    d = make_deps(factory, aws_provider, sent, clock)
    ec2_shim.drop_reply("RunInstances")
    out = tasks.acquire_run(d, pool, 1, "aws-lost-answer")
    assert out.retry and out.error == "Unavailable" and not out.acquired
    assert [r.state for r in rows(factory)] == ["requested"]
    status = pool_status(factory, pool)
    assert not any(status.get(k) for k in ("failing_until", "exhausted_until", "quota_until")), (
        status
    )
    assert sent.replans == []
    again = tasks.acquire_run(d, pool, 1, "aws-lost-answer")  # the task's retry
    (row,) = rows(factory)
    mine = [i for i in aws_provider.list_instances() if i.idempotency_key == row.idempotency_key]
    assert [i.id for i in mine] == again.acquired == [row.provider_instance_id]
    tasks.release_run(d, row.id)


def test_an_instance_of_a_failed_request_is_deleted_when_its_provider_holds_nothing_else(
    factory, fleet, local, sent, clock
):
    """The launch failed for us (its row `failed`) but happened at the provider: the
    reconcile sweep deletes it — also when the provider holds nothing else, which the sweep
    used not to visit at all (the instance billed for ever)."""
    pool = fleet.pool()
    d = make_deps(factory, local, sent, clock)
    assert tasks.acquire_run(d, pool, 1, "task-9").acquired
    (row,) = rows(factory)
    with transaction(factory) as s:  # as a failure recorded after the launch leaves it
        s.get_one(m.Instance, row.id).state = "failed"
    assert len(local.list_instances()) == 1
    counts = tasks.reconcile_run(d)
    assert counts["orphans"] == 1 and local.list_instances() == []


def test_an_instance_acquired_while_a_sweep_was_frozen_is_not_taken_for_gone(
    factory, fleet, local, sent, clock, monkeypatch
):
    """The sweep lists, is frozen (SIGSTOP) two minutes, and meanwhile another worker
    acquires an instance: not in the old listing, and judged against the clock after the
    freeze it was past its grace, marked gone and then deleted as an orphan."""
    pool = fleet.pool()
    d = make_deps(factory, local, sent, clock)
    listing, frozen = local.list_instances, []

    def list_then_freeze():
        seen = listing()
        if not frozen:
            frozen.append(True)
            clock.advance(120)
            assert tasks.acquire_run(d, pool, 1, "task-meanwhile").acquired
        return seen

    monkeypatch.setattr(local, "list_instances", list_then_freeze)
    counts = tasks.reconcile_run(d)
    (row,) = rows(factory)
    assert counts["gone"] == 0 and row.state == "running"


def test_a_replan_does_not_write_an_old_pool_status_back_over_a_newer_one(
    factory, fleet, local, sent, clock
):
    """A re-plan reads every pool first (load_world), places, then records procurement in
    the same session: a capacity failure recorded meanwhile by an acquire (`exhausted_until`)
    was written back over with the status it had read, and the pool was asked again."""
    pool = fleet.pool()
    with transaction(factory) as s:
        world = list(s.scalars(select(m.Pool)))  # what load_world reads first, and keeps
        d = make_deps(
            factory, Flaky(local, before=[InsufficientCapacity("none left")]), sent, clock
        )
        assert tasks.acquire_run(d, pool, 1, "task-7").error == "InsufficientCapacity"  # meanwhile
        assert plan_procurement(s, {pool: 8}, clock()) == []  # exhausted: nothing asked
    assert "exhausted_until" in pool_status(factory, pool) and world
