"""What a plane reports becomes events a person can read, filed where they will look."""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane.contracts import ReplicasScaled
from controlplane.services.observed import DbSink
from tests.integration.api import builders as b


async def test_a_scaling_decision_is_an_event_of_its_deployment_and_counted_once(
    admin, session_factory
):
    b.seed(admin)
    admin.post("deployments", b.deployment())
    replans: list[str] = []
    sink = DbSink(session_factory, on_change=replans.append)
    fact = ReplicasScaled(cluster="use1-a", source="cluster/use1-a", deployment="chat-llm",
                          from_replicas=1, to_replicas=3, reason="panic: 3.1x target")  # fmt: skip
    await sink.record_fact("use1-a", fact, datetime.now(UTC))
    await sink.record_fact("use1-a", fact, datetime.now(UTC))  # redelivered: still one event

    events = admin.get("events", object_kind="Deployment", object_name="chat-llm").json()["items"]
    assert [e["type"] for e in events] == ["ReplicasScaled"]
    assert "1 → 3 replicas: panic" in events[0]["message"]
    assert replans == []  # scaling inside the quota needs no re-plan
