"""Demand reported upward: the local autoscaler's hysteresis, on an injected clock.

A rise is reported at once; a fall only after the scale-down delay (then to the highest
demand seen meanwhile); a demand hovering across an integer never moves the report down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.workloadplane.test_agent_autoscale import (
    make_deployment,
    make_plane,
    queue,
    settle,
    tick,
)
from workloadplane.demand import ReportedDemand, reported_demand
from workloadplane.router.core import Backend, Router, Ticket


def report(demands: list[int], delay: float, window: float = 0.0,
           panic_at: frozenset[int] = frozenset()) -> list[int | None]:  # fmt: skip
    """The report after each demand, one demand per second."""
    state, out = ReportedDemand(), []
    for t, demand in enumerate(demands):
        state = reported_demand(state, demand, float(t), delay, window, urgent=t in panic_at)
        out.append(state.value)
    return out


def test_a_rise_is_reported_at_once():
    assert report([2, 2, 3, 5], delay=60) == [2, 2, 3, 5]


def test_a_rise_of_one_replica_waits_for_the_window_a_larger_one_or_panic_does_not():
    assert report([2] + [3] * 12, delay=60, window=10) == [2] + [2] * 10 + [3, 3]
    assert report([2, 4], delay=60, window=10) == [2, 4]
    assert report([2, 3], delay=60, window=10, panic_at=frozenset({1})) == [2, 3]


def test_a_demand_flickering_one_above_is_never_reported():
    assert set(report([2, 3] * 60, delay=60, window=10)) == {2}


def test_a_fall_waits_for_the_delay_then_reports_the_peak_seen_meanwhile():
    demands = [3] + [2] * 5 + [1] * 6
    reported = report(demands, delay=10)
    assert reported[:11] == [3] * 11  # lower since t=1, for less than 10 s
    assert reported[11] == 2  # the highest demand of the 10 s below 3, not 1


def test_a_demand_flipping_across_an_integer_never_lowers_the_report():
    flips = [3, 2] * 60  # every second for two minutes: below 3 never holds for 60 s
    assert set(report(flips, delay=60)) == {3}


def test_a_return_to_the_reported_value_restarts_the_delay():
    demands = [3] + [2] * 8 + [3] + [2] * 8
    assert set(report(demands, delay=10)) == {3}


@pytest.mark.asyncio(loop_scope="session")
async def test_the_heartbeat_demand_does_not_follow_a_flickering_load(tmp_path: Path):
    """The churn of issue 12 item 7: a plane at its quota's max (2) with a load hovering
    around that (7 / 9 in flight at 4 per replica): the decision's demand flips 2 <-> 3
    every tick. Reported as it was, each flip re-planned a replica in or out elsewhere; now
    the report goes to 3 once and stays there."""
    agent, runtime, clock, _ = await make_plane(
        tmp_path, make_deployment(min_=1, max_=2, window=1, delay=30)
    )
    agent.wanted["chat"] = 2
    await settle(agent, runtime)
    router = agent.router
    assert router is not None and agent.autoscaler is not None
    reported, raw = [], []
    held = hold(router, 7)
    for second in range(20):
        flicker = second % 2 == 0  # 9 (3 replicas' worth: 8 in flight, 1 queued) <-> 7
        extra = hold(router, 1) if flicker else []
        waiting = queue(router, 1) if flicker else []
        await asyncio.sleep(0)
        await tick(agent, clock)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for backend, ticket in extra:
            router.release(backend, ticket)
        raw.append(agent.autoscaler.last["chat"].unconstrained_desired)
        reported.append(agent.autoscaler.demand("chat"))
        await asyncio.sleep(0)
    assert raw.count(3) >= 8 and raw.count(2) >= 8, raw  # the flicker is real
    assert set(reported) == {3}, reported
    observed = await agent.observed_state()
    assert [d.demand for d in observed.deployments] == [3]
    for backend, ticket in held:
        router.release(backend, ticket)


def hold(router: Router, n: int) -> list[tuple[Backend, Ticket]]:
    """``n`` requests in flight, with what releasing each needs."""
    entry = router.deployments["chat"]
    out = []
    for _ in range(n):
        ticket = Ticket(tier=1)
        backend = router.try_acquire(entry, ticket)
        assert backend is not None, "no free slot"
        out.append((backend, ticket))
    return out
