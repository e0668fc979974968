"""A control plane behind its planes (back after an outage, or slower than they report for a
while) recorded every queued heartbeat, each a database write, and fell further behind: a
plane restarted meanwhile was not seen alive for minutes. A heartbeat is the plane's whole
state, so one with a newer heartbeat of the same plane already in the stream is acked
unread; facts are all recorded, in order."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.bus import InMemorySink, ReportConsumer
from controlplane.bus.consumer import SUPERSEDED
from controlplane.contracts import DesiredStateApplied, ObservedState, encode, utcnow
from tests.integration.bus.conftest import Bus, eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def _publish(bus: Bus, cluster: str, reports: list) -> None:
    nc = await bus.connect(bus.clusters[cluster])
    js = nc.jetstream()
    try:
        for report in reports:
            kind = "observed" if isinstance(report, ObservedState) else f"fact.{report.type}"
            await js.publish(f"gpufleet.v1.cluster.{cluster}.{kind}", encode(report),
                             headers={"Nats-Msg-Id": str(report.id)})  # fmt: skip
    finally:
        await nc.close()


def _heartbeat(cluster: str, generation: int) -> ObservedState:
    return ObservedState(cluster=cluster, source=f"cluster/{cluster}", observed_generation=generation)  # fmt: skip


async def test_a_backlog_of_heartbeats_costs_one_record_per_plane(bus: Bus):
    # 60 heartbeats from each of two planes, facts between them, all queued before the
    # consumer starts (the control plane was away)
    reports: dict[str, list] = {"a": [], "b": []}
    for g in range(1, 61):
        for name, queued in reports.items():
            queued.append(_heartbeat(name, g))
            if g % 20 == 0:
                queued.append(DesiredStateApplied(cluster=name, source=f"cluster/{name}",
                                                  generation=g))  # fmt: skip
    for name, queued in reports.items():
        await _publish(bus, name, queued)

    sink = InMemorySink()
    # the consumer's clock 5 s ahead: the queued heartbeats read as having waited
    consumer = ReportConsumer(bus.js, sink, clock=lambda: utcnow() + timedelta(seconds=5))
    skipped = SUPERSEDED._value.get()
    await consumer.start()
    try:

        async def drained() -> bool:
            return (await consumer.progress()).pending == 0

        await eventually(drained, 20, "the backlog processed")
        newest = {c: s.observed_generation for c, s in sink.observed}
        assert newest == {"a": 60, "b": 60}, "each plane's newest heartbeat is recorded"
        recorded = len(sink.observed)
        assert recorded <= 6, f"{recorded} of 120 queued heartbeats recorded"
        assert SUPERSEDED._value.get() - skipped == 120 - recorded
        facts = [(c, f.generation) for c, f in sink.facts]  # type: ignore[attr-defined]
        assert sorted(facts) == [(c, g) for c in "ab" for g in (20, 40, 60)], "every fact"

        # no backlog: each heartbeat is recorded as it comes
        await _publish(bus, "a", [_heartbeat("a", 61)])
        await eventually(lambda: len(sink.observed) == recorded + 1, 10, "a live heartbeat")
        await _publish(bus, "a", [_heartbeat("a", 62)])
        await eventually(lambda: len(sink.observed) == recorded + 2, 10, "the next one")
        assert [s.observed_generation for _, s in sink.observed[-2:]] == [61, 62]
    finally:
        await consumer.stop()
