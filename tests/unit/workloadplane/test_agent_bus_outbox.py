"""The agent's fact outbox: sent at once when nothing waits, retried until acknowledged, in
order behind a backlog. The NATS publish is replaced by a recorder (no server here; the
real path is in tests/integration/bus)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from controlplane.contracts import DesiredStateApplied, Envelope
from workloadplane.bus import OUTBOX_BATCH, AgentBus


class Publisher:
    """Stands in for JetStream: records what is acknowledged; fails while ``down``."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.attempts = 0
        self.down = False

    async def __call__(self, subject: str, message: Envelope) -> None:
        self.attempts += 1
        await asyncio.sleep(0)  # a round trip
        if self.down:
            raise ConnectionError("no route to NATS")
        assert isinstance(message, DesiredStateApplied)
        self.acked.append(message.generation)


def make_bus(publisher: Publisher) -> AgentBus:
    bus = AgentBus("a", "nats://unused", None, on_desired=lambda s, raw: asyncio.sleep(0),
                   retry_delay=0.001)  # fmt: skip
    bus._nc = SimpleNamespace(is_connected=True)  # type: ignore[assignment]
    bus._publish = publisher  # type: ignore[method-assign]
    return bus


def applied(generation: int) -> DesiredStateApplied:
    return DesiredStateApplied(cluster="a", source="cluster/a", generation=generation)


async def until(check, what: str) -> None:
    try:
        async with asyncio.timeout(5):
            while not check():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_fact_is_sent_at_once_without_the_outbox_task():
    publisher = Publisher()
    bus = make_bus(publisher)  # not started: no outbox task runs
    bus.publish_fact(applied(1))
    bus.publish_fact(applied(2))
    await until(lambda: len(publisher.acked) == 2, "both sent")
    assert publisher.acked == [1, 2] and bus.outbox_size == 0


async def test_a_failed_fact_is_kept_and_retried_and_later_ones_queue_behind_it():
    publisher = Publisher()
    bus = make_bus(publisher)
    sender = asyncio.create_task(bus._send_outbox())
    try:
        publisher.down = True
        bus.publish_fact(applied(1))
        await until(lambda: publisher.attempts >= 1 and bus.outbox_size == 1, "1 kept")
        bus.publish_fact(applied(2))  # a backlog: it queues behind 1, in order
        bus.publish_fact(applied(3))
        await until(lambda: publisher.attempts >= 4, "retries while NATS is down")
        assert publisher.acked == [] and bus.outbox_size == 3, "nothing accepted is lost"
        publisher.down = False
        await until(lambda: bus.outbox_size == 0, "the outbox drained")
        assert publisher.acked == [1, 2, 3]
        bus.publish_fact(applied(4))  # empty again: straight out
        await until(lambda: publisher.acked[-1:] == [4], "4 sent")
    finally:
        sender.cancel()
        await bus.close()


async def test_sends_in_flight_are_bounded_and_the_rest_queue_in_order():
    publisher = Publisher()
    bus = make_bus(publisher)
    sender = asyncio.create_task(bus._send_outbox())
    try:
        for generation in range(1, OUTBOX_BATCH + 11):
            bus.publish_fact(applied(generation))
        assert len(bus._in_flight) == OUTBOX_BATCH and bus.outbox_size == 10
        await until(lambda: len(publisher.acked) == OUTBOX_BATCH + 10, "all sent")
        assert sorted(publisher.acked) == list(range(1, OUTBOX_BATCH + 11))
    finally:
        sender.cancel()
        await bus.close()
