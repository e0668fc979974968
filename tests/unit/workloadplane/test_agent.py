"""The agent's decisions without NATS: a Runtime double and a temp state dir."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.contracts import DesiredStateApplied, Envelope, ReplicaFailed, ReplicaStarted
from tests.unit.workloadplane.builders import RecordingRuntime, make_deployment, make_desired
from workloadplane.agent import Agent
from workloadplane.state import DesiredStateStore

pytestmark = pytest.mark.asyncio(loop_scope="session")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FactsBus:
    def __init__(self) -> None:
        self.facts: list[Envelope] = []

    def publish_fact(self, fact: Envelope) -> None:
        self.facts.append(fact)


def make_agent(tmp_path: Path, runtime: RecordingRuntime) -> tuple[Agent, FactsBus]:
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), clock=lambda: NOW)
    bus = FactsBus()
    agent.bus = bus  # type: ignore[assignment]
    return agent, bus


async def test_applies_newer_snapshot_and_acknowledges_it(tmp_path: Path):
    runtime = RecordingRuntime()
    agent, bus = make_agent(tmp_path, runtime)
    await agent.on_desired(make_desired(3, make_deployment(min_=2)))
    await agent.reconcile_once()
    assert [c for c, _ in runtime.calls] == ["start", "start"]
    assert [(type(f), f.generation) for f in bus.facts
            if isinstance(f, DesiredStateApplied)] == [(DesiredStateApplied, 3)]  # fmt: skip
    assert bus.facts[0].time == NOW
    assert bus.facts[0].source == "cluster/a"


async def test_older_snapshot_is_ignored(tmp_path: Path):
    runtime = RecordingRuntime()
    agent, _ = make_agent(tmp_path, runtime)
    await agent.on_desired(make_desired(3, make_deployment(min_=1)))
    await agent.on_desired(make_desired(2, make_deployment(min_=4)))
    assert agent.desired is not None
    assert agent.desired.generation == 3
    assert DesiredStateStore(tmp_path).load().generation == 3  # type: ignore[union-attr]


async def test_without_any_desired_state_nothing_is_touched(tmp_path: Path):
    runtime = RecordingRuntime()
    await runtime.start("someone-elses", make_deployment().spec)
    agent, _ = make_agent(tmp_path, runtime)
    await agent.reconcile_once()
    assert runtime.calls == [("start", "someone-elses-1")]


async def test_restarted_agent_adopts_replicas_from_the_saved_snapshot(tmp_path: Path):
    runtime = RecordingRuntime()
    first, _ = make_agent(tmp_path, runtime)
    await first.on_desired(make_desired(4, make_deployment(min_=2)))
    await first.reconcile_once()
    runtime.make_ready()
    runtime.calls.clear()
    second, bus = make_agent(tmp_path, runtime)  # e.g. after a crash, NATS unreachable
    assert second.desired is not None
    assert second.desired.generation == 4
    await second.reconcile_once()
    assert runtime.calls == []  # kept its replicas
    assert [f.generation for f in bus.facts if isinstance(f, DesiredStateApplied)] == [4]


async def test_replica_transitions_become_facts(tmp_path: Path):
    runtime = RecordingRuntime()
    agent, bus = make_agent(tmp_path, runtime)
    await agent.on_desired(make_desired(1, make_deployment(min_=2)))
    await agent.reconcile_once()
    runtime.make_ready()
    await agent.reconcile_once()
    failed_id = next(iter(runtime.replicas))
    runtime.replicas[failed_id] = runtime.replicas[failed_id].model_copy(update={"state": "failed"})
    await agent.reconcile_once()
    kinds = [type(f).__name__ for f in bus.facts if not isinstance(f, DesiredStateApplied)]
    assert kinds == ["ReplicaStarted", "ReplicaStarted", "ReplicaFailed"]
    assert isinstance(bus.facts[-1], ReplicaFailed | ReplicaStarted)
    assert ("stop", failed_id) in runtime.calls  # failed replica cleaned up and replaced
    assert sum(r.state in ("starting", "ready") for r in runtime.replicas.values()) == 2


async def test_heartbeat_reports_generation_replicas_and_demand(tmp_path: Path):
    runtime = RecordingRuntime()
    agent, _ = make_agent(tmp_path, runtime)
    await agent.on_desired(make_desired(5, make_deployment(min_=1, max_=2)))
    await agent.reconcile_once()
    agent.wanted["chat"] = 7  # beyond max: the control plane should learn about it
    beat = await agent.observed_state()
    assert beat.observed_generation == 5
    assert len(beat.replicas) == 1
    assert beat.deployments[0].demand == 7
    assert beat.time == NOW


def _replicas_metric(deployment: str, state: str) -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(
        "gpufleet_agent_replicas", {"deployment": deployment, "state": state}
    )


async def test_the_replicas_gauge_follows_the_listing_and_forgets_a_deleted_deployment(
    tmp_path: Path,
):
    runtime = RecordingRuntime()
    agent, _ = make_agent(tmp_path, runtime)
    dep = make_deployment("gauge-only", min_=2)  # no other agent in this process serves it
    await agent.on_desired(make_desired(1, dep))
    await agent.reconcile_once()  # starts two
    await agent.reconcile_once()  # lists them
    assert _replicas_metric(dep.name, "starting") == 2
    runtime.make_ready()
    await agent.reconcile_once()
    assert _replicas_metric(dep.name, "ready") == 2
    assert _replicas_metric(dep.name, "starting") is None  # emptied: gone, not a stale 2
    for replica_id in list(runtime.replicas):
        await runtime.stop(replica_id)
    await agent.reconcile_once()
    assert _replicas_metric(dep.name, "ready") is None
