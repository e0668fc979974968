"""The consumer asks the server for a plane's newest heartbeat only behind a backlog (more
reports wait, and this one waited); when the server cannot say (a permission the control
plane's user lacks costs a timeout each time), every queued heartbeat is recorded and the
server is not asked again for a while. A subject naming no valid cluster is rejected, not
left unacked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from controlplane.bus import InMemorySink, ReportConsumer
from controlplane.contracts import ObservedState, encode

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Refusing:
    def __init__(self) -> None:
        self.asked = 0

    async def get_last_msg(self, stream: str, subject: str) -> None:
        self.asked += 1
        raise TimeoutError("nats: timeout")


class Delivered:
    """A JetStream delivery of one heartbeat, with more reports waiting behind it."""

    def __init__(self, seq: int, waited_s: float = 10.0, cluster: str = "a") -> None:
        self.subject = f"gpufleet.v1.cluster.{cluster}.observed"
        self.data = encode(ObservedState(cluster="a", source="cluster/a", observed_generation=seq))
        stored = datetime.now(UTC) - timedelta(seconds=waited_s)
        self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_pending=5,
                                        num_delivered=1, timestamp=stored)  # fmt: skip
        self.acked = self.termed = False

    async def ack(self) -> None:
        self.acked = True

    async def term(self) -> None:
        self.termed = True


async def test_a_server_that_cannot_name_the_newest_heartbeat_is_not_asked_at_each_one():
    js, sink = Refusing(), InMemorySink()
    consumer = ReportConsumer(js, sink)  # type: ignore[arg-type]
    deliveries = [Delivered(seq) for seq in range(1, 6)]
    for msg in deliveries:
        await consumer.handle(msg)  # type: ignore[arg-type]
    assert [s.observed_generation for _, s in sink.observed] == [1, 2, 3, 4, 5]
    assert all(m.acked for m in deliveries)
    assert js.asked == 1


async def test_a_heartbeat_that_did_not_wait_is_recorded_without_a_question():
    js, sink = Refusing(), InMemorySink()
    consumer = ReportConsumer(js, sink)  # type: ignore[arg-type]
    await consumer.handle(Delivered(1, waited_s=0.0))  # type: ignore[arg-type]
    assert len(sink.observed) == 1 and js.asked == 0


async def test_a_heartbeat_on_a_subject_naming_no_valid_cluster_is_rejected():
    js, sink = Refusing(), InMemorySink()
    consumer = ReportConsumer(js, sink)  # type: ignore[arg-type]
    bad = Delivered(1, cluster="Bad_Name")
    await consumer.handle(bad)  # type: ignore[arg-type]
    assert bad.termed and not sink.observed
