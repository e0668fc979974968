"""The agent's decisions without NATS: a Runtime double and a temp state dir."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.contracts import (
    MAX_REPORT_ENTRIES,
    DeploymentObserved,
    DesiredStateApplied,
    Envelope,
    ReplicaFailed,
    ReplicaStarted,
)
from tests.unit.workloadplane.builders import RecordingRuntime, make_deployment, make_desired
from workloadplane.agent import Agent, reportable
from workloadplane.runtime.gpus import InsufficientGpusError
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


async def test_a_plane_given_more_deployments_than_a_heartbeat_holds_still_heartbeats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A heartbeat carries at most MAX_REPORT_ENTRIES deployments: a plane given more built
    one that failed to validate and sent none, and the control plane took it for dead."""
    agent, _ = make_agent(tmp_path, RecordingRuntime())
    names = [f"d-{i:04d}" for i in range(MAX_REPORT_ENTRIES + 4)]
    await agent.on_desired(make_desired(1, *(make_deployment(n, min_=0) for n in names)))
    agent.wanted["d-4099"] = 3  # the last by name, but it has demand: it is kept
    with caplog.at_level(logging.WARNING, logger="workloadplane.agent"):
        beats = [await agent.observed_state() for _ in range(3)]
    reported = [d.name for d in beats[-1].deployments]
    assert len(reported) == MAX_REPORT_ENTRIES and reported == sorted(reported)
    assert (
        "d-4099" in reported
        and next(d.demand for d in beats[-1].deployments if d.name == "d-4099") == 3
    )
    warned = [r for r in caplog.records if "a heartbeat reports at most" in r.getMessage()]
    assert len(warned) == 1, "said once, not at every heartbeat"


async def test_the_entries_a_heartbeat_keeps_are_those_with_traffic_then_demand_lanes_last():
    entries = [
        DeploymentObserved(name="idle"),
        DeploymentObserved(name="lane", in_flight=9),
        DeploymentObserved(name="busy", queue_depth=1),
        DeploymentObserved(name="wanted", demand=2),
    ]
    assert [d.name for d in reportable(entries, {"lane"}, most=2)] == ["busy", "wanted"]
    assert [d.name for d in reportable(entries, {"lane"}, most=3)] == ["idle", "busy", "wanted"]
    assert reportable(entries, set(), most=4) == entries


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


class ShortOfGpus(RecordingRuntime):
    async def start(self, deployment, spec, **kwargs):  # type: ignore[override]
        raise InsufficientGpusError("1 GPU wanted, 0 free")


async def test_a_start_short_of_gpus_is_logged_once_while_it_lasts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """It is retried every pass (2 s and every wake-up): a line each time, with a traceback
    and the whole spec, filled the agent's log."""
    agent, _ = make_agent(tmp_path, ShortOfGpus())
    await agent.on_desired(make_desired(1, make_deployment(min_=1)))
    with caplog.at_level(logging.WARNING, logger="workloadplane.agent"):
        for _ in range(3):
            await agent.reconcile_once()
    lines = [r for r in caplog.records if "StartReplica chat" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "0 free" in lines[0].getMessage() and "model_id" not in lines[0].getMessage()


async def test_replica_facts_go_out_when_the_pass_fails_after_noting_them(tmp_path: Path):
    runtime = RecordingRuntime()
    agent, bus = make_agent(tmp_path, runtime)
    await agent.on_desired(make_desired(1, make_deployment(min_=1)))
    await agent.reconcile_once()
    runtime.make_ready()

    async def broken(*args: object) -> None:
        raise RuntimeError("a bug after the listing")

    agent._act = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await agent.reconcile_once()
    assert [type(f).__name__ for f in bus.facts][-1] == "ReplicaStarted"


async def test_the_heartbeat_goes_out_when_free_capacity_cannot_be_worked_out(tmp_path: Path):
    """A heartbeat that raises is no heartbeat: the control plane would take a plane that
    serves for dead."""

    class BrokenInventory:
        def gpu_capacity(self) -> tuple[int, int]:
            raise RuntimeError("a bug in reconcile or the inventory")

    runtime = RecordingRuntime()
    agent, _ = make_agent(tmp_path, runtime)
    agent.gpus = BrokenInventory()  # type: ignore[assignment]
    await agent.on_desired(make_desired(2, make_deployment(min_=1)))
    beat = await agent.observed_state()
    assert beat.observed_generation == 0 and beat.free_capacity == []


class SlowStops(RecordingRuntime):
    """Each stop yields while it waits out its (simulated) grace period."""

    def __init__(self) -> None:
        super().__init__()
        self.active = self.most = 0

    async def stop(self, replica_id: str) -> None:
        self.active += 1
        self.most = max(self.most, self.active)
        for _ in range(3):
            await asyncio.sleep(0)
        self.active -= 1
        await super().stop(replica_id)


async def test_the_replicas_of_a_removed_deployment_stop_at_once_not_one_by_one(tmp_path: Path):
    """A hung engine takes its whole stop grace period: eight, one after the other, held the
    action lock (the autoscaler, the acknowledgement) for two minutes."""
    runtime = SlowStops()
    agent, _ = make_agent(tmp_path, runtime)
    await agent.on_desired(make_desired(1, make_deployment(min_=8, max_=8)))
    await agent.reconcile_once()  # eight starting replicas
    await agent.on_desired(make_desired(2))
    await agent.reconcile_once()
    assert runtime.replicas == {} and runtime.most == 8
