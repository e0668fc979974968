"""The agent's autoscale pass without processes or NATS: a Runtime double, a real Router fed
by hand (slots taken and requests queued without any network), and an injected clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from controlplane.contracts import (
    AutoscalingPolicy,
    CapacityExhausted,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
    ScheduleWindow,
)
from tests.unit.workloadplane.builders import RecordingRuntime, make_desired
from tests.unit.workloadplane.test_agent import FactsBus
from workloadplane.agent import Agent
from workloadplane.autoscaler_loop import Autoscaler, Gauges
from workloadplane.autoscaling import ScaleAction
from workloadplane.router.core import Router, RouterConfig, Ticket
from workloadplane.router.remote import RemoteRouter
from workloadplane.state import DesiredStateStore

pytestmark = pytest.mark.asyncio(loop_scope="session")
MONDAY_NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = MONDAY_NOON) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class EndpointRuntime(RecordingRuntime):
    """RecordingRuntime whose replicas have endpoints, so the router tracks them."""

    async def start(self, deployment: str, spec: RevisionSpec, *, pool: str | None = None,
                    instance: str | None = None, serves: str = "") -> ReplicaStatus:  # fmt: skip
        replica = await super().start(deployment, spec, pool=pool, instance=instance)
        port = 20000 + len(self.replicas)
        self.replicas[replica.replica_id] = replica.model_copy(
            update={"endpoint": f"http://127.0.0.1:{port}"}
        )
        return self.replicas[replica.replica_id]


def make_deployment(min_: int = 1, max_: int = 4, *, target: float = 4, window: float = 10,
                    delay: float = 10, idle: float | None = None,
                    schedule: list[ScheduleWindow] | None = None) -> DeploymentDesired:  # fmt: skip
    return DeploymentDesired(
        name="chat",
        spec=RevisionSpec(model_id="org/chat", revision="r1"),
        quota=ReplicaQuota(min=min_, max=max_),
        autoscaling=AutoscalingPolicy(
            window_seconds=window,
            scale_down_delay_seconds=delay,
            target_concurrency=target,
            scale_to_zero_idle_seconds=idle,
            schedule=schedule or [],
        ),
    )


async def make_plane(tmp_path: Path, deployment: DeploymentDesired,
                     config: RouterConfig | None = None) -> tuple[Agent, EndpointRuntime, Clock, FactsBus]:  # fmt: skip
    runtime, clock, bus = EndpointRuntime(), Clock(), FactsBus()
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), clock=clock,
                  router=Router(config or RouterConfig()))  # fmt: skip
    agent.bus = bus  # type: ignore[assignment]
    await agent.on_desired(make_desired(1, deployment))
    return agent, runtime, clock, bus


async def settle(agent: Agent, runtime: EndpointRuntime) -> None:
    """One reconcile pass, its replicas made ready, and the router told."""
    await agent.reconcile_once()
    runtime.make_ready()
    await agent.reconcile_once()


def take_slots(router: Router, n: int) -> list[Ticket]:
    """``n`` requests in flight on the ready replicas (least loaded first)."""
    entry = router.deployments["chat"]
    tickets = [Ticket(tier=1) for _ in range(n)]
    for ticket in tickets:
        assert router.try_acquire(entry, ticket) is not None, "no free slot"
    return tickets


def queue(router: Router, n: int) -> list[asyncio.Task]:
    entry = router.deployments["chat"]
    return [asyncio.create_task(router.acquire(entry, Ticket(tier=1))) for _ in range(n)]


async def tick(agent: Agent, clock: Clock, ticks: int = 1) -> None:
    for _ in range(ticks):
        clock.advance(1)
        await agent.autoscale_once()


async def test_a_3x_load_step_scales_up_within_two_ticks(tmp_path: Path):
    agent, runtime, clock, _ = await make_plane(tmp_path, make_deployment(max_=4))
    await settle(agent, runtime)
    router = agent.router
    assert router is not None
    take_slots(router, 4)  # at the target: one replica's worth
    await tick(agent, clock, 12)
    assert agent.wanted["chat"] == 1
    waiting = queue(router, 8)  # 3x: 4 in flight + 8 queued
    await asyncio.sleep(0)
    await tick(agent, clock, 2)
    assert agent.wanted["chat"] == 3
    event = agent.autoscaler.events[-1]  # type: ignore[union-attr]
    assert event.action is ScaleAction.SCALE_UP and event.panic and event.to_replicas == 3
    await agent.reconcile_once()
    assert [c for c, _ in runtime.calls].count("start") == 3
    for task in waiting:
        task.cancel()


async def test_the_loop_decides_again_early_for_a_decision_that_asks_for_it():
    """Autoscaler.run: a deployment whose decision set ``confirm`` is decided again that
    long after, alone, without waiting for the next tick (10 s away here)."""
    autoscaler = Autoscaler(Router(RouterConfig()), lambda: datetime.now(UTC))
    calls: list[set[str] | None] = []
    second = asyncio.Event()

    async def tick(only: set[str] | None) -> None:
        calls.append(only)
        if len(calls) == 1:
            autoscaler.confirm["chat"] = 0.05
        else:
            second.set()

    loop = asyncio.create_task(autoscaler.run(10.0, tick))
    try:
        async with asyncio.timeout(5):
            await second.wait()
    finally:
        loop.cancel()
    assert calls == [None, {"chat"}]


async def test_scale_down_drains_the_replicas_the_decision_names(tmp_path: Path):
    agent, runtime, clock, _ = await make_plane(tmp_path, make_deployment(min_=1, max_=3))
    agent.wanted["chat"] = 3
    await settle(agent, runtime)
    router = agent.router
    assert router is not None
    busy = take_slots(router, 1)  # one replica has a request in flight
    busy_replica = next(b.replica_id for b in router.backends.values() if b.outstanding)
    await tick(agent, clock, 25)  # a full window, then the scale-down delay
    (down,) = [e for e in agent.autoscaler.events if e.action is ScaleAction.SCALE_DOWN]  # type: ignore[union-attr]
    assert (down.from_replicas, down.to_replicas) == (3, 1)
    assert busy_replica not in down.drain and len(down.drain) == 2
    drained = [rid for call, rid in runtime.calls if call == "drain"]
    assert drained == list(down.drain)  # exactly the named ones...
    await agent.reconcile_once()
    assert [rid for call, rid in runtime.calls if call in ("drain", "stop")] == drained  # ...only
    assert agent.wanted["chat"] == 1 and busy


async def test_a_request_at_zero_wakes_the_autoscaler(tmp_path: Path):
    deployment = make_deployment(min_=0, max_=2, idle=30)
    agent, runtime, clock, _ = await make_plane(tmp_path, deployment)
    await agent.reconcile_once()
    await tick(agent, clock, 3)
    assert agent.wanted["chat"] == 0 and runtime.replicas == {}
    autoscaler, router = agent.autoscaler, agent.router
    assert autoscaler is not None and router is not None
    waiting = queue(router, 1)
    await asyncio.sleep(0)
    woken = await autoscaler.woken(timeout=0)  # set already: no wait for the tick
    assert woken == {"chat"}
    await agent.autoscale_once(woken)
    assert agent.wanted["chat"] == 1
    await agent.reconcile_once()  # starts it; the router sees it starting at once
    assert [b.state for b in router.backends.values()] == ["starting"]
    queue(router, 1)
    await asyncio.sleep(0)
    assert await autoscaler.woken(timeout=0) == set()  # starting: no second wake
    runtime.make_ready()
    await agent.reconcile_once()
    backend = await asyncio.wait_for(waiting[0], 1)  # the held request goes to it
    assert backend.state == "ready"


async def test_demand_beyond_max_is_reported_upward_once(tmp_path: Path):
    agent, runtime, clock, bus = await make_plane(tmp_path, make_deployment(min_=1, max_=1))
    await settle(agent, runtime)
    router = agent.router
    assert router is not None
    take_slots(router, 4)
    waiting = queue(router, 20)  # 24 requests: 6 replicas' worth, max 1
    await asyncio.sleep(0)
    await tick(agent, clock, 3)
    observed = await agent.observed_state()
    assert observed.deployments[0].demand == 6 and agent.wanted["chat"] == 1
    facts = [f for f in bus.facts if isinstance(f, CapacityExhausted)]
    assert len(facts) == 1 and facts[0].deployment == "chat" and facts[0].wanted == 6
    assert "beyond max 1" in facts[0].reason
    for task in waiting:
        task.cancel()


async def test_policy_target_is_the_routers_per_replica_limit(tmp_path: Path):
    agent, runtime, clock, _ = await make_plane(tmp_path, make_deployment(target=2.6))
    await settle(agent, runtime)
    router = agent.router
    assert router is not None and router.deployments["chat"].limit == 3
    take_slots(router, 3)  # a 4th would exceed the router's limit
    assert router.try_acquire(router.deployments["chat"], Ticket(tier=1)) is None
    await tick(agent, clock, 12)
    assert agent.wanted["chat"] == 1  # 3 in flight / target 3: one replica, not two


async def test_a_schedule_window_raises_min_in_its_time_zone(tmp_path: Path):
    window = ScheduleWindow(days=[0], start="12:30", end="14:00", timezone="Europe/Paris",
                            min_replicas=3)  # fmt: skip
    agent, runtime, clock, _ = await make_plane(tmp_path, make_deployment(schedule=[window]))
    await settle(agent, runtime)
    await tick(agent, clock)  # 13:01 in Paris, Monday
    assert agent.wanted["chat"] == 3
    event = agent.autoscaler.events[-1]  # type: ignore[union-attr]
    assert "min replicas 3" in event.reason


async def test_vllm_gauges_raise_the_count(tmp_path: Path):
    agent, runtime, clock, _ = await make_plane(tmp_path, make_deployment())
    await settle(agent, runtime)
    autoscaler = agent.autoscaler
    assert autoscaler is not None
    (rid,) = runtime.replicas
    autoscaler.gauges[rid] = (clock.now + timedelta(seconds=1), Gauges(num_requests_waiting=8))
    await tick(agent, clock)
    assert agent.wanted["chat"] == 3  # ready 1 + 8 waiting / target 4
    autoscaler.gauges[rid] = (clock.now - timedelta(seconds=10), Gauges(9, 1.0))  # stale
    replicas = await runtime.list_replicas()
    signals = autoscaler.signals(make_deployment(), replicas, clock.now)
    assert signals is not None
    (signal,) = signals.replicas
    assert (signal.num_requests_waiting, signal.kv_cache_usage_perc) == (0, 0)


async def test_a_rollout_is_left_to_reconcile(tmp_path: Path):
    agent, runtime, clock, _ = await make_plane(tmp_path, make_deployment(min_=2, max_=4))
    await settle(agent, runtime)
    await tick(agent, clock, 3)
    new = make_deployment(min_=2, max_=4).model_copy(
        update={"spec": RevisionSpec(model_id="org/chat", revision="r2")}
    )
    await agent.on_desired(make_desired(2, new))
    await agent.reconcile_once()  # two r2 replicas starting next to the two r1 ones
    assert len(runtime.replicas) == 4
    await tick(agent, clock, 30)  # well past the window and the scale-down delay
    assert agent.wanted["chat"] == 2
    assert not [call for call, _ in runtime.calls if call in ("drain", "stop")]


async def test_the_heartbeat_carries_the_routers_token_counters(tmp_path: Path):
    agent, runtime, _, _ = await make_plane(tmp_path, make_deployment(min_=1, max_=1))
    await settle(agent, runtime)
    router = agent.router
    assert router is not None
    assert (await agent.observed_state()).deployments[0].usage is None
    router.count_usage("chat", 100, 40, 2048)
    usage = (await agent.observed_state()).deployments[0].usage
    assert usage is not None and usage.since == router.since
    assert (usage.input_tokens, usage.output_tokens, usage.response_bytes) == (100, 40, 2048)


def agent_metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_one_deployments_failing_decision_does_not_stop_the_others(tmp_path: Path):
    """A NaN gauge (or any other fault) in one deployment's decision raised out of
    ``autoscale_once`` before the deployments after it were decided: at every tick, for good."""
    bad = make_deployment().model_copy(update={"name": "bad"})
    agent, runtime, clock, _ = await make_plane(tmp_path, bad)
    await agent.on_desired(make_desired(2, bad, make_deployment()))  # "bad" is decided first
    await settle(agent, runtime)
    autoscaler, router = agent.autoscaler, agent.router
    assert autoscaler is not None and router is not None
    (bad_replica,) = [rid for rid, r in runtime.replicas.items() if r.deployment == "bad"]
    nan = Gauges(num_requests_waiting=float("nan"))
    autoscaler.gauges[bad_replica] = (clock.now + timedelta(seconds=1), nan)
    take_slots(router, 4)
    waiting = queue(router, 4)  # chat: two replicas' worth
    await asyncio.sleep(0)
    failures = agent_metric("gpufleet_agent_autoscale_failures_total")
    await tick(agent, clock, 3)
    assert agent.wanted["chat"] == 2, "chat is decided all the same"
    assert "bad" not in autoscaler.last
    assert agent_metric("gpufleet_agent_autoscale_failures_total") == failures + 3
    for task in waiting:
        task.cancel()


class LoadClock:
    """The RemoteRouter's monotonic clock (when the router's report came, and its age)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_stale_load_report_holds_the_autoscaler_rather_than_reading_zero_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The plane's router stops answering /internal/load: its last report goes stale. Read
    as (0, 0) it fed the policy zero-load samples and scaled a busy deployment to zero."""
    runtime, clock, loads = EndpointRuntime(), Clock(), LoadClock()
    remote = RemoteRouter("127.0.0.1", 1, clock=loads)
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), clock=clock,
                  router=remote)  # fmt: skip
    agent.bus = FactsBus()  # type: ignore[assignment]
    await agent.on_desired(make_desired(1, make_deployment(min_=0, idle=5)))
    agent.wanted["chat"] = 1  # scaled up from zero earlier
    await settle(agent, runtime)
    (rid,) = runtime.replicas

    def report(in_flight: int) -> dict:
        return {
            "deployments": {"chat": {"in_flight": in_flight, "queued": 0, "at_zero": False}},
            "replicas": {rid: {"in_flight": in_flight, "state": "ready"}},
        }

    remote.apply_report(report(3), loads())
    await tick(agent, clock, 3)
    assert agent.wanted["chat"] == 1 and agent.autoscaler is not None
    before = agent.autoscaler.states["chat"]
    held = agent_metric("gpufleet_agent_autoscale_held_total")
    loads.now += 2.5  # no answer for 2.5 s: the report is stale
    with caplog.at_level("WARNING", logger="workloadplane.autoscaler_loop"):
        await tick(agent, clock, 40)  # past the window, the delay and the idle time
    assert agent.wanted["chat"] == 1, "held, not scaled to zero"
    assert agent.autoscaler.states["chat"] == before, "no sample taken"
    assert agent_metric("gpufleet_agent_autoscale_held_total") == held + 40
    assert sum("load report is stale" in r.message for r in caplog.records) == 1  # once
    remote.apply_report(report(3), loads())  # it answers again
    await tick(agent, clock)
    assert agent.autoscaler.states["chat"] != before
