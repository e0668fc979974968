"""Issue 12 item 10 against the real `up` fleet: bus input must not wedge a plane. A valid
snapshot with a generation the control plane never issued (10^12) was applied and every
later normal update ignored; the agent's rejected-message counter was served nowhere."""

from __future__ import annotations

import asyncio

import httpx
import nats

from controlplane.contracts import DESIRED_BUCKET, DesiredState, desired_key
from tests.integration.faults.conftest import Fleet
from tests.integration.test_up import _wait_until


async def _put_desired(fleet: Fleet, cluster: str, make: object) -> None:
    """Overwrite `cluster`'s desired-state entry as the control plane's NATS user would:
    `make(entry bytes) -> new bytes`."""
    conn = await nats.connect(fleet.nats_url, **fleet.nats_credentials("controlplane"))
    try:
        kv = await conn.jetstream().key_value(DESIRED_BUCKET)
        entry = await kv.get(desired_key(cluster))
        assert entry.value is not None
        await kv.put(desired_key(cluster), make(entry.value))  # type: ignore[operator]
    finally:
        await conn.close()


def test_a_huge_generation_does_not_wedge_a_plane(fleet: Fleet) -> None:
    """Item 10: a valid snapshot with generation 10^12 was applied and every later normal
    update ignored."""
    cluster = fleet.serving("eu-assistant")

    def forged(value: bytes) -> bytes:
        snapshot = DesiredState.model_validate_json(value)
        return snapshot.model_copy(update={"generation": 10**12}).model_dump_json().encode()

    asyncio.run(_put_desired(fleet, cluster, forged))
    # a normal change afterwards must still reach the plane: eu-assistant at 2 replicas at least
    assert (
        fleet.api.patch(
            "/api/v1/deployments/eu-assistant",
            json={"autoscaling": {"min_replicas": 2}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).status_code
        == 200
    )

    def two_running() -> bool:
        return sum("eu-assistant" in r for r in fleet.replica_pids(cluster)) >= 2

    try:
        _wait_until(two_running, 60, f"{cluster} to apply the change made after the forgery")
    finally:
        fleet.api.patch(
            "/api/v1/deployments/eu-assistant",
            json={"autoscaling": {"min_replicas": 1}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    epochs = fleet.api.get("/api/v1/events", params={"type": "DesiredEpochStarted"}).json()
    assert any(cluster in e["message"] for e in epochs["items"]), epochs


def test_the_agents_rejections_are_served_on_its_metrics_endpoint(fleet: Fleet) -> None:
    """Item 10: `gpufleet_agent_rejected_messages_total` existed but no endpoint served it."""
    cluster = fleet.serving("eu-assistant")
    metric = 'gpufleet_agent_rejected_messages_total{reason="malformed"}'

    def count() -> float:
        text = httpx.get(fleet.agent_metrics(cluster), timeout=10).text
        lines = [line for line in text.splitlines() if line.startswith(metric)]
        return float(lines[0].split()[-1]) if lines else 0.0

    before = count()
    asyncio.run(_put_desired(fleet, cluster, lambda value: b"{not json"))
    _wait_until(lambda: count() >= before + 1, 30, "the rejection on the agent's /metrics")
    # and the plane still serves, and takes the control plane's next snapshot
    assert "eu-assistant" in fleet.models(cluster)
