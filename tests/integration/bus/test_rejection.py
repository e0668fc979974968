"""Malformed or wrong-version messages are rejected, counted and logged; nobody crashes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from controlplane.bus import publish_desired
from controlplane.contracts import (
    DesiredStateApplied,
    ObservedState,
    desired_key,
    encode,
    fact_subject,
    observed_subject,
)
from tests.integration.bus.builders import make_desired, start_agent
from tests.integration.bus.conftest import Bus, eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def counted(metric: str, reason: str) -> float:
    return REGISTRY.get_sample_value(f"{metric}_total", {"reason": reason}) or 0.0


async def test_controlplane_rejects_bad_reports_and_keeps_consuming(
    bus: Bus, consumer, caplog: pytest.LogCaptureFixture
):
    _, sink = consumer
    metric = "gpufleet_bus_rejected_messages"
    before = {
        r: counted(metric, r)
        for r in ("malformed", "schema_version", "invalid", "cluster_mismatch")
    }
    nc = await bus.connect(bus.clusters["a"])
    js = nc.jetstream(timeout=1)
    v2 = json.loads(encode(ObservedState(cluster="a", source="cluster/a")))
    v2["schema_version"] = 2
    no_generation = json.loads(
        encode(DesiredStateApplied(cluster="a", source="cluster/a", generation=1))
    )
    del no_generation["generation"]
    bad = [
        (observed_subject("a"), b"\x00 not json"),
        (observed_subject("a"), b"[1, 2]"),
        (observed_subject("a"), json.dumps(v2).encode()),
        (fact_subject("a", "desired_state_applied"), json.dumps(no_generation).encode()),
        (observed_subject("a"), encode(ObservedState(cluster="b", source="cluster/b"))),
    ]
    try:
        with caplog.at_level(logging.WARNING, logger="controlplane.bus.consumer"):
            for subject, data in bad:
                await js.publish(subject, data)
            good = ObservedState(cluster="a", source="cluster/a", observed_generation=5)
            await js.publish(observed_subject("a"), encode(good))
            await eventually(lambda: len(sink.observed) == 1, what="the good heartbeat")
        assert sink.observed[0][1].id == good.id
        assert counted(metric, "malformed") - before["malformed"] == 2
        assert counted(metric, "schema_version") - before["schema_version"] == 1
        assert counted(metric, "invalid") - before["invalid"] == 1
        assert counted(metric, "cluster_mismatch") - before["cluster_mismatch"] == 1
        assert sum("rejected message" in r.getMessage() for r in caplog.records) == 5

        # Terminated, not redelivered: nothing is left pending on the durable.
        async def settled() -> bool:
            info = await bus.js.consumer_info("GPUFLEET_V1_REPORTS", "gpufleet-controlplane")
            return info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0

        await eventually(settled, what="every message acked or terminated")
    finally:
        await nc.close()


async def test_agent_rejects_bad_desired_state_and_keeps_serving(
    bus: Bus, consumer, tmp_path: Path
):
    _, sink = consumer
    metric = "gpufleet_agent_rejected_messages"
    before = {r: counted(metric, r) for r in ("malformed", "schema_version", "invalid")}
    running = start_agent("a", bus.url, bus.clusters["a"], tmp_path / "agent")
    try:
        await publish_desired(bus.kv, make_desired("a", 1, replicas=2))
        await eventually(lambda: running.agent.applied_generation == 1, what="generation 1")
        future = json.loads(encode(make_desired("a", 2)))
        future["schema_version"] = 2
        for data in (b"{oops", json.dumps(future).encode(), b'{"schema_version": 1}'):
            await bus.kv.put(desired_key("a"), data)
        await eventually(
            lambda: counted(metric, "invalid") - before["invalid"] == 1, what="three rejections"
        )
        assert counted(metric, "malformed") - before["malformed"] == 1
        assert counted(metric, "schema_version") - before["schema_version"] == 1
        # Still on generation 1 with its replicas, and still taking newer snapshots.
        assert len(await running.runtime.list_replicas()) == 2
        await bus.kv.put(desired_key("a"), encode(make_desired("a", 3, replicas=1)))
        await eventually(lambda: running.agent.applied_generation == 3, what="generation 3")
        assert len(await running.runtime.list_replicas()) == 1
        assert not running.task.done()
        await eventually(
            lambda: (
                {3} <= {f.generation for _, f in sink.facts if isinstance(f, DesiredStateApplied)}
            ),
            what="generation 3 acknowledged",
        )
    finally:
        await running.close()
