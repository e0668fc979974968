"""A cluster's credentials read only its own desired state and publish only as itself.

Every refusal here comes from nats-server (permissions in the rendered config), not from
our client code: the test talks raw NATS where the client library would get in the way.
"""

from __future__ import annotations

import json

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from controlplane.bus import publish_desired
from controlplane.contracts import (
    DESIRED_STREAM,
    REPORTS_STREAM,
    ObservedState,
    desired_subject,
    encode,
    observed_subject,
)
from tests.integration.bus.builders import make_desired
from tests.integration.bus.conftest import Bus, eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def violations(errors: list[Exception]) -> list[str]:
    """The server's refusals, as nats-py reports them (lower-cased)."""
    return [str(e).lower() for e in errors if "permissions violation" in str(e).lower()]


def consumer_request(filter_subject: str, deliver: str) -> bytes:
    return json.dumps(
        {
            "stream_name": DESIRED_STREAM,
            "config": {
                "name": "spy",
                "filter_subject": filter_subject,
                "deliver_subject": deliver,
                "ack_policy": "none",
                "deliver_policy": "last_per_subject",
            },
        }
    ).encode()


async def test_cluster_reads_its_own_key(bus: Bus):
    await publish_desired(bus.kv, make_desired("a", 4))
    nc = await bus.connect(bus.clusters["a"])
    try:
        raw = await nc.jsm(timeout=1).get_msg(
            DESIRED_STREAM, subject=desired_subject("a"), direct=True
        )
        assert raw.data is not None
        assert json.loads(raw.data)["generation"] == 4
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        resp = await nc.request(
            f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.mine.{desired_subject('a')}",
            consumer_request(desired_subject("a"), inbox),
            timeout=1,
        )
        assert "error" not in json.loads(resp.data)
        msg = await sub.next_msg(timeout=1)
        assert json.loads(msg.data)["generation"] == 4
    finally:
        await nc.close()


async def test_cluster_a_cannot_read_cluster_b_desired_state(bus: Bus):
    await publish_desired(bus.kv, make_desired("b", 7))
    errors: list[Exception] = []
    nc = await bus.connect(bus.clusters["a"], errors)
    try:
        inbox = nc.new_inbox()
        # 1. A consumer on B's key: the create subject is not in A's publish allow list.
        with pytest.raises(NatsTimeoutError):
            await nc.request(
                f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.spy.{desired_subject('b')}",
                consumer_request(desired_subject("b"), inbox),
                timeout=0.25,
            )
        # 2. A's own create subject with B's key in the body: the server checks they match.
        resp = await nc.request(
            f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.spy.{desired_subject('a')}",
            consumer_request(desired_subject("b"), inbox),
            timeout=1,
        )
        assert json.loads(resp.data)["error"]["err_code"] == 10131  # filter does not match
        # 3. Direct get of B's key, the generic message get, and a core subscription on it.
        with pytest.raises(NatsTimeoutError):
            await nc.request(
                f"$JS.API.DIRECT.GET.{DESIRED_STREAM}.{desired_subject('b')}", b"", timeout=0.25
            )
        with pytest.raises(NatsTimeoutError):
            await nc.request(
                f"$JS.API.STREAM.MSG.GET.{DESIRED_STREAM}",
                json.dumps({"last_by_subj": desired_subject("b")}).encode(),
                timeout=0.25,
            )
        spy = await nc.subscribe(desired_subject("b"))
        await nc.flush()
        await publish_desired(bus.kv, make_desired("b", 8))
        with pytest.raises(NatsTimeoutError):
            await spy.next_msg(timeout=0.3)
        await eventually(lambda: len(violations(errors)) == 4, what="four server refusals")
        refused = violations(errors)
        assert refused == [
            f'nats: permissions violation for publish to "{s.lower()}"'
            for s in (
                f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.spy.{desired_subject('b')}",
                f"$JS.API.DIRECT.GET.{DESIRED_STREAM}.{desired_subject('b')}",
                f"$JS.API.STREAM.MSG.GET.{DESIRED_STREAM}",
            )
        ] + [f'nats: permissions violation for subscription to "{desired_subject("b").lower()}"']
    finally:
        await nc.close()


async def test_cluster_a_cannot_publish_as_cluster_b(bus: Bus, consumer):
    _, sink = consumer
    errors: list[Exception] = []
    nc = await bus.connect(bus.clusters["a"], errors)
    try:
        forged = ObservedState(cluster="b", source="cluster/b", observed_generation=99)
        await nc.publish(observed_subject("b"), encode(forged))
        # Nor may it write desired state, its own included.
        await nc.publish(desired_subject("a"), encode(make_desired("a", 100)))
        honest = ObservedState(cluster="a", source="cluster/a", observed_generation=1)
        await nc.publish(observed_subject("a"), encode(honest))
        await nc.flush()
        # One connection's publishes are stored in order: when a's heartbeat (sent last) is
        # in, anything forged before it would be stored too; the stream holds only a's.
        await eventually(lambda: bool(sink.observed), what="a's own heartbeat")
        await eventually(lambda: len(violations(errors)) >= 2, what="server refusals")
        assert (await bus.js.stream_info(REPORTS_STREAM)).state.messages == 1
        assert [c for c, _ in sink.observed] == ["a"]
        refused = " ".join(violations(errors))
        assert f'publish to "{observed_subject("b")}"' in refused
        assert f'publish to "{desired_subject("a").lower()}"' in refused
        with pytest.raises(Exception, match=r"not found|no keys"):
            await bus.kv.get("a")
    finally:
        await nc.close()


async def test_a_plane_cannot_invent_report_subjects(bus: Bus, consumer):
    """Each reports subject has its own share of the stream (REPORTS_PER_SUBJECT): a plane
    may publish the fact subjects that exist, not names it makes up."""
    errors: list[Exception] = []
    nc = await bus.connect(bus.clusters["a"], errors)
    try:
        await nc.publish("gpufleet.v1.cluster.a.fact.made_up_1", b"{}")
        await nc.flush()
        await eventually(lambda: bool(violations(errors)), what="the server's refusal")
        assert 'publish to "gpufleet.v1.cluster.a.fact.made_up_1"' in " ".join(violations(errors))
        assert (await bus.js.stream_info(REPORTS_STREAM)).state.messages == 0
    finally:
        await nc.close()
