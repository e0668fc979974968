"""A plane's heartbeat grows with its replicas (~270 bytes each): past NATS's default
max_payload (1 MiB, ~3,800 replicas) every heartbeat failed, logged at debug level only,
and the control plane took a plane that served for dead. gpufleet's own server allows what
a report may be (MAX_REPORT_BYTES); a server that allows less is named in an error."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlplane.contracts import (
    MAX_REPORT_BYTES,
    ObservedState,
    ReplicaStatus,
    encode,
)
from tests.integration.bus.conftest import Bus, eventually
from workloadplane.bus import AgentBus

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _heartbeat(replicas: int) -> ObservedState:
    return ObservedState(
        cluster="a",
        source="cluster/a",
        replicas=[
            ReplicaStatus(
                replica_id=f"chat-{i:06d}",
                deployment="chat",
                revision="r1",
                state="ready",
                instance=f"i-{i:06d}",
            )
            for i in range(replicas)
        ],
    )


async def _agent_bus(bus: Bus) -> AgentBus:
    agent = AgentBus("a", bus.url, bus.clusters["a"], on_desired=lambda s, raw: asyncio.sleep(0))
    await agent.start()
    await eventually(lambda: agent.connected, 10, "the agent's connection")
    return agent


async def test_a_heartbeat_of_eight_thousand_replicas_reaches_the_control_plane(bus, consumer):
    _, sink = consumer
    state = _heartbeat(8000)
    assert 1 << 20 < len(encode(state)) < MAX_REPORT_BYTES  # over NATS's default max_payload
    agent = await _agent_bus(bus)
    try:
        assert await agent.publish_heartbeat(state)
        await eventually(lambda: bool(sink.observed), 10, "the heartbeat recorded")
        assert len(sink.observed[0][1].replicas) == 8000
    finally:
        await agent.close()


async def test_a_heartbeat_over_the_servers_max_payload_is_an_error_naming_it(
    bus, caplog: pytest.LogCaptureFixture
):
    agent = await _agent_bus(bus)
    try:
        with caplog.at_level(logging.ERROR, logger="workloadplane.bus"):
            state = _heartbeat(65_000)
            assert len(encode(state)) > MAX_REPORT_BYTES
            assert not await agent.publish_heartbeat(state)
        [record] = [r for r in caplog.records if "max_payload" in r.getMessage()]
        assert "raise max_payload" in record.getMessage()
    finally:
        await agent.close()
