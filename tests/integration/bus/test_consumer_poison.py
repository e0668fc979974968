"""A report the sink fails on every time (not for want of its database) was redelivered for
ever: it held the reports stream's ack floor, and with it every plane's liveness (the bus
reports itself behind). It is now dropped after ``max_sink_tries`` and counted; a sink
whose store is away (``transient``) is retried for as long as it is."""

from __future__ import annotations

import pytest

from controlplane.bus import InMemorySink, ReportConsumer
from controlplane.contracts import DesiredStateApplied, encode
from tests.integration.bus.conftest import Bus, eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class Failing(InMemorySink):
    """Fails ``fails`` times on the fact of generation 1; ``away``: as a database away."""

    def __init__(self, fails: int, away: bool) -> None:
        super().__init__()
        self.fails, self.away, self.tries = fails, away, 0

    def transient(self, exc: BaseException) -> bool:
        return self.away

    async def record_fact(self, cluster, fact, received_at):  # type: ignore[override]
        if getattr(fact, "generation", 0) == 1 and self.tries < self.fails:
            self.tries += 1
            raise RuntimeError("a bug on this report")
        return await super().record_fact(cluster, fact, received_at)


async def _send(bus: Bus, generations: range) -> None:
    nc = await bus.connect(bus.clusters["a"])
    try:
        for g in generations:
            fact = DesiredStateApplied(cluster="a", source="cluster/a", generation=g)
            await nc.jetstream().publish(f"gpufleet.v1.cluster.a.fact.{fact.type}", encode(fact),
                                         headers={"Nats-Msg-Id": str(fact.id)})  # fmt: skip
    finally:
        await nc.close()


async def test_a_report_the_sink_always_fails_on_is_dropped_and_the_stream_moves_on(bus: Bus):
    sink = Failing(fails=10**6, away=False)
    consumer = ReportConsumer(bus.js, sink, redeliver_delay_s=0.01, max_sink_tries=3)
    await consumer.start()
    try:
        await _send(bus, range(1, 4))
        await eventually(lambda: len(sink.facts) == 2, 10, "the reports after the bad one")

        async def drained() -> bool:
            return (await consumer.progress()).pending == 0

        await eventually(drained, 10, "the ack floor past the bad report")
        assert sink.tries == 3
    finally:
        await consumer.stop()


async def test_a_sink_whose_store_is_away_is_retried_past_the_tries(bus: Bus):
    sink = Failing(fails=6, away=True)  # the database came back at the 7th delivery
    consumer = ReportConsumer(bus.js, sink, redeliver_delay_s=0.01, max_sink_tries=3)
    await consumer.start()
    try:
        await _send(bus, range(1, 2))
        await eventually(lambda: len(sink.facts) == 1, 10, "the report, once the store is back")
        assert sink.tries == 6
    finally:
        await consumer.stop()
