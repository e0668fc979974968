"""Desired state reaches the agent, once, in order, through duplicates and NATS restarts."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from controlplane.bus import InMemorySink, ReportConsumer, publish_desired
from controlplane.contracts import (
    DesiredStateApplied,
    ObservedState,
    RejectedMessageError,
    ReplicaStarted,
    desired_key,
    encode,
)
from tests.integration.bus.builders import make_desired, start_agent
from tests.integration.bus.conftest import Bus, eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def applied(sink: InMemorySink, cluster: str) -> list[int]:
    return [
        f.generation for c, f in sink.facts if c == cluster and isinstance(f, DesiredStateApplied)
    ]


async def test_desired_change_reaches_agent_and_is_acknowledged(bus: Bus, consumer, tmp_path: Path):
    _, sink = consumer
    running = start_agent("a", bus.url, bus.clusters["a"], tmp_path / "agent")
    try:
        result = await publish_desired(bus.kv, make_desired("a", 1, replicas=2))
        assert result.outcome == "published"
        await eventually(lambda: 1 in applied(sink, "a"), what="DesiredStateApplied(1)")
        assert len(await running.runtime.list_replicas()) == 2
        await eventually(
            lambda: sum(isinstance(f, ReplicaStarted) for _, f in sink.facts) == 2,
            what="two ReplicaStarted facts",
        )
        await eventually(
            lambda: any(o.observed_generation == 1 for _, o in sink.observed),
            what="a heartbeat reporting generation 1",
        )
        # The snapshot was persisted before it was acted on.
        assert running.agent.desired is not None
        assert running.agent.store.load() == running.agent.desired
    finally:
        await running.close()


async def test_duplicates_and_late_older_generation_change_nothing(
    bus: Bus, consumer, tmp_path: Path
):
    _, sink = consumer
    running = start_agent("a", bus.url, bus.clusters["a"], tmp_path / "agent")
    try:
        newest = make_desired("a", 2, replicas=3)
        await publish_desired(bus.kv, newest)
        await eventually(lambda: 2 in applied(sink, "a"), what="generation 2 applied")
        replicas_before = {r.replica_id for r in await running.runtime.list_replicas()}

        # The publisher refuses to go backwards or to repeat itself...
        assert (await publish_desired(bus.kv, make_desired("a", 1))).outcome == "stale"
        assert (await publish_desired(bus.kv, make_desired("a", 2))).outcome == "stale"
        # ...and the agent ignores an older or duplicate snapshot that arrives anyway.
        await bus.kv.put(desired_key("a"), encode(make_desired("a", 1, replicas=1)))
        await bus.kv.put(desired_key("a"), encode(newest))
        marker = make_desired("a", 3, replicas=3)
        await bus.kv.put(desired_key("a"), encode(marker))
        await eventually(lambda: 3 in applied(sink, "a"), what="generation 3 applied")

        assert running.agent.desired is not None
        assert running.agent.desired.generation == 3
        assert applied(sink, "a") == [2, 3]
        assert {r.replica_id for r in await running.runtime.list_replicas()} == replicas_before
        assert running.runtime.started == 3
    finally:
        await running.close()


async def test_nats_restart_mid_stream_agent_ends_on_newest(bus: Bus, tmp_path: Path):
    running = start_agent("a", bus.url, bus.clusters["a"], tmp_path / "agent")
    newest = 30
    try:
        for generation in range(1, newest + 1):
            if generation == 12:
                await bus.nc.flush()
                bus.server.restart()
            state = make_desired("a", generation, replicas=1 + generation % 3)
            await eventually(
                lambda s=state: _try_publish(bus, s),
                timeout=10,
                what=f"publishing generation {generation}",
            )
        await eventually(
            lambda: running.agent.applied_generation == newest,
            timeout=10,
            what="agent on the newest generation",
        )
        assert running.agent.desired is not None
        assert running.agent.desired.generation == newest
        assert len(await running.runtime.list_replicas()) == 1 + newest % 3
    finally:
        await running.close()


async def _try_publish(bus: Bus, state) -> bool:
    try:
        await publish_desired(bus.kv, state)
    except Exception:
        return False
    return True


async def test_controlplane_consumer_restart_loses_nothing(bus: Bus, tmp_path: Path):
    first = InMemorySink()
    # Messages pushed to a consumer that vanished come back after ack_wait: keep it short.
    consumer = ReportConsumer(bus.js, first, ack_wait_s=1.0)
    await consumer.start()
    agent_nc = await bus.connect(bus.clusters["a"])
    agent_js = agent_nc.jetstream()
    sent = []

    async def send(generation: int) -> None:
        fact = DesiredStateApplied(cluster="a", source="cluster/a", generation=generation)
        sent.append(fact.id)
        await agent_js.publish(
            f"gpufleet.v1.cluster.a.fact.{fact.type}",
            encode(fact),
            headers={"Nats-Msg-Id": str(fact.id)},
        )

    try:
        for g in range(1, 6):
            await send(g)
        await eventually(lambda: len(first.facts) == 5, what="first five facts")
        await consumer.stop()
        for g in range(6, 16):  # the control plane is down
            await send(g)
        second = InMemorySink()
        restarted = ReportConsumer(bus.js, second, ack_wait_s=1.0)
        await restarted.start()
        await eventually(lambda: len(second.facts) == 10, what="facts sent while down")
        await restarted.stop()
        received = [f.id for _, f in first.facts] + [f.id for _, f in second.facts]
        assert received == sent
    finally:
        await agent_nc.close()


class _FailsOnce(InMemorySink):
    """PostgreSQL down for the first write: the consumer naks and the message comes back."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def record_fact(self, cluster, fact, received_at):  # type: ignore[override]
        if not self.failed:
            self.failed = True
            raise ConnectionError("database unavailable")
        return await super().record_fact(cluster, fact, received_at)


async def test_a_failed_write_is_redelivered_and_counted_and_delay_measured(bus: Bus):
    from prometheus_client import REGISTRY

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    fact_type = DesiredStateApplied(cluster="a", source="cluster/a", generation=1).type

    before = {
        "redelivered": sample("gpufleet_bus_redelivered_messages_total"),
        "failures": sample("gpufleet_bus_sink_failures_total"),
        "delays": sample("gpufleet_bus_report_delay_seconds_count", {"type": fact_type}),
    }
    sink = _FailsOnce()
    consumer = ReportConsumer(bus.js, sink, durable="redelivery-test", redeliver_delay_s=0.1)
    await consumer.start()
    agent_nc = await bus.connect(bus.clusters["a"])
    try:
        fact = DesiredStateApplied(cluster="a", source="cluster/a", generation=7)
        await agent_nc.jetstream().publish(f"gpufleet.v1.cluster.a.fact.{fact.type}", encode(fact))
        await eventually(lambda: len(sink.facts) == 1, what="the fact, second delivery")
        assert sample("gpufleet_bus_sink_failures_total") - before["failures"] == 1
        assert sample("gpufleet_bus_redelivered_messages_total") - before["redelivered"] == 1
        delays = sample("gpufleet_bus_report_delay_seconds_count", {"type": fact_type})
        assert delays - before["delays"] == 1  # the first delivery's, not the retry's
        progress = await consumer.progress()
        assert sample("gpufleet_bus_pending_messages") == progress.pending == 0
    finally:
        await agent_nc.close()
        await consumer.stop()


class _HeartbeatFailsOnce(InMemorySink):
    """PostgreSQL down for the first heartbeat: it comes back after the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[int, datetime] = {}

    async def record_observed(self, cluster, state, received_at):  # type: ignore[override]
        if not self.times and state.observed_generation == 1 and not self.observed:
            self.times[-1] = received_at  # the failed first delivery
            raise ConnectionError("database unavailable")
        self.times[state.observed_generation] = received_at
        return await super().record_observed(cluster, state, received_at)


async def test_a_heartbeat_redelivered_after_a_newer_one_is_dated_before_it(bus: Bus):
    """The sink keeps the newest heartbeat by the time it is given (an older one
    redelivered late must not overwrite the plane's newer state): a redelivery is dated
    when the stream stored it, not when the retry came."""
    sink = _HeartbeatFailsOnce()
    consumer = ReportConsumer(bus.js, sink, durable="late-heartbeat", redeliver_delay_s=0.5)
    await consumer.start()
    agent_nc = await bus.connect(bus.clusters["a"])
    try:
        js = agent_nc.jetstream()
        for generation in (1, 2):
            beat = ObservedState(cluster="a", source="cluster/a", observed_generation=generation)
            await js.publish("gpufleet.v1.cluster.a.observed", encode(beat))
            await eventually(
                lambda g=generation: len(sink.times) == g, what=f"heartbeat {generation}"
            )
        await eventually(lambda: 1 in sink.times, what="the first heartbeat, redelivered")
        assert sink.times[1] < sink.times[2], sink.times  # read as older: the sink keeps 2
        assert sink.times[-1] <= sink.times[1] + timedelta(seconds=0.05)
    finally:
        await agent_nc.close()
        await consumer.stop()


class _RefusesOnce(InMemorySink):
    """The database refuses a value of the first report (DbSink turns that into a rejection)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def record_fact(self, cluster, fact, received_at):  # type: ignore[override]
        self.calls += 1
        if self.calls == 1:
            raise RejectedMessageError("invalid_value", "the database refused a value")
        return await super().record_fact(cluster, fact, received_at)


async def test_a_report_the_sink_refuses_is_dropped_and_counted_not_retried_for_ever(bus: Bus):
    """A poison report (one the database refuses on every try) redelivered for ever would
    hold the stream's ack floor, and with it every plane's liveness."""
    from prometheus_client import REGISTRY

    def rejected() -> float:
        labels = {"reason": "invalid_value"}
        return REGISTRY.get_sample_value("gpufleet_bus_rejected_messages_total", labels) or 0.0

    before = rejected()
    sink = _RefusesOnce()
    consumer = ReportConsumer(bus.js, sink, durable="poison-test", redeliver_delay_s=0.1)
    await consumer.start()
    agent_nc = await bus.connect(bus.clusters["a"])
    try:
        js = agent_nc.jetstream()
        for g in (1, 2):
            fact = DesiredStateApplied(cluster="a", source="cluster/a", generation=g)
            await js.publish(f"gpufleet.v1.cluster.a.fact.{fact.type}", encode(fact))
        await eventually(lambda: len(sink.facts) == 1, what="the second fact")
        assert [f.generation for _, f in sink.facts] == [2]  # type: ignore[union-attr]
        assert rejected() - before == 1
        progress = await consumer.progress()  # nothing left to redeliver
        assert progress.pending == 0 and progress.ack_floor == progress.stream_last_seq
        assert sink.calls == 2
    finally:
        await agent_nc.close()
        await consumer.stop()
