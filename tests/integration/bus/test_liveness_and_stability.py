"""Heartbeats drive liveness; the agent keeps serving from disk when NATS is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.bus import InMemorySink, ReportConsumer, publish_desired
from controlplane.liveness import Liveness, liveness_changes
from controlplane.local.ports import free_port
from tests.integration.bus.builders import make_desired, start_agent
from tests.integration.bus.conftest import Bus, eventually
from workloadplane.runtime.memory import InMemoryRuntime
from workloadplane.state import DesiredStateStore

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

STALE = timedelta(seconds=15)
DOWN = timedelta(seconds=60)


class ManualClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_heartbeats_stop_cluster_goes_stale_then_down(bus: Bus, tmp_path: Path):
    clock = ManualClock()
    sink = InMemorySink()
    consumer = ReportConsumer(bus.js, sink, durable="liveness", clock=clock)
    await consumer.start()
    running = start_agent("a", bus.url, bus.clusters["a"], tmp_path / "agent")
    seen: dict[str, Liveness] = {}

    def step() -> dict:
        changes = liveness_changes(seen, sink.last_heartbeat, clock.now, STALE, DOWN)
        seen.update({c: new for c, (_, new) in changes.items()})
        return changes

    try:
        await eventually(lambda: "a" in sink.last_heartbeat, what="a heartbeat")
        assert step() == {"a": (None, "healthy")}
        await running.close()  # heartbeats stop
        count = len(sink.observed)
        clock.now += STALE - timedelta(seconds=1)
        assert step() == {}
        clock.now += timedelta(seconds=1)
        assert step() == {"a": ("healthy", "stale")}
        clock.now += DOWN - STALE
        assert step() == {"a": ("stale", "down")}
        assert step() == {}
        assert len(sink.observed) == count  # really no heartbeat since
    finally:
        await consumer.stop()


async def test_agent_serves_from_disk_without_nats_then_converges_to_newest(
    bus: Bus, consumer, tmp_path: Path
):
    state_dir = tmp_path / "agent"
    DesiredStateStore(state_dir).save(make_desired("a", 5, replicas=2))
    runtime = InMemoryRuntime()
    nowhere = f"nats://127.0.0.1:{free_port()}"
    offline = start_agent("a", nowhere, bus.clusters["a"], state_dir, runtime)
    try:
        await eventually(lambda: runtime.started == 2, what="replicas from the saved snapshot")
        assert offline.agent.applied_generation == 5
        assert not offline.agent.bus or not offline.agent.bus.connected
    finally:
        await offline.close()

    # Restarted (still NATS-less at first) it adopts its replicas instead of restarting them.
    # The control plane meanwhile holds an older generation (e.g. restored from a backup)
    # and then publishes a newer one.
    await publish_desired(bus.kv, make_desired("a", 4, replicas=1))
    online = start_agent("a", bus.url, bus.clusters["a"], state_dir, runtime)
    _, sink = consumer
    try:
        await eventually(
            lambda: any(o.observed_generation == 5 for _, o in sink.observed),
            what="heartbeat on generation 5",
        )
        assert online.agent.desired is not None
        assert online.agent.desired.generation == 5  # never back to 4
        assert runtime.started == 2
        assert len(await runtime.list_replicas()) == 2
        await publish_desired(bus.kv, make_desired("a", 6, replicas=3))
        await eventually(lambda: online.agent.applied_generation == 6, what="generation 6")
        assert len(await runtime.list_replicas()) == 3
        assert DesiredStateStore(state_dir).load().generation == 6  # type: ignore[union-attr]
    finally:
        await online.close()
