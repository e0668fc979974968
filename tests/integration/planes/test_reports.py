"""What a plane reports becomes events a person can read, filed where they will look."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from controlplane.contracts import ObservedState, ReplicaFailed, ReplicasScaled, ReplicaStatus
from controlplane.db import models as m
from controlplane.db.session import transaction
from controlplane.services.observed import DbSink
from controlplane.services.placement import replan
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


async def test_a_reported_replica_is_linked_to_the_instance_it_runs_on(admin, session_factory):
    b.seed(admin)
    admin.post("deployments", b.deployment())
    hello = ObservedState(cluster="use1-a", source="cluster/use1-a")
    await DbSink(session_factory).record_observed("use1-a", hello, datetime.now(UTC))
    with transaction(session_factory) as s:  # use1-a is healthy: chat-llm is given to it
        assert replan(s, "test") is not None
    with transaction(session_factory) as s:
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "use1-a")).one()
        pool = s.scalars(select(m.Pool).where(m.Pool.name == "aws-use1-h100-od")).one()
        instance = m.Instance(pool_id=pool.id, cluster_id=cluster.id, provider_instance_id="i-0abc",
                              idempotency_key="test-i-0abc", gpus=8, state="running")  # fmt: skip
        s.add(instance)
        s.flush()
        instance_id = instance.id
    sink = DbSink(session_factory, on_change=lambda reason: None)
    on_it = ReplicaStatus(replica_id="r-1", deployment="chat-llm", revision="1", state="ready",
                          pool="aws-use1-h100-od", instance="i-0abc")  # fmt: skip
    elsewhere = on_it.model_copy(update={"replica_id": "r-2", "instance": "i-unknown"})
    heartbeat = ObservedState(cluster="use1-a", source="cluster/use1-a",
                              replicas=[on_it, elsewhere])  # fmt: skip
    await sink.record_observed("use1-a", heartbeat, datetime.now(UTC))

    replicas = admin.get("replicas", cluster="use1-a").json()["items"]
    assert {r["name"]: r["instance_id"] for r in replicas} == {"r-1": instance_id}
    # r-2 claims an instance not held for use1-a: not recorded (issue 12 item 4)
    rejected = admin.get("events", type="ReportRejected", object_name="use1-a").json()["items"]
    assert [e["data"]["reason"] for e in rejected] == ["instance_not_given"]
    assert "instance i-unknown is not held for this cluster" in rejected[0]["message"]


async def test_a_replica_fact_of_a_deleted_deployment_draining_is_no_rejection(
    admin, session_factory
):
    """A plane drains what it was told to retire and reports on it meanwhile (a replica
    failing on its way out): that records nothing and raises no `ReportRejected`, which
    would hide a forgery's for a minute. One of a deployment never given is rejected."""
    b.seed(admin)
    admin.post("deployments", b.deployment())
    sink = DbSink(session_factory, on_change=lambda reason: None)
    hello = ObservedState(cluster="use1-a", source="cluster/use1-a")
    await sink.record_observed("use1-a", hello, datetime.now(UTC))
    with transaction(session_factory) as s:  # use1-a is healthy: chat-llm is given to it
        assert replan(s, "test") is not None
    assert admin.delete("deployments/chat-llm?force=true").status_code == 204

    def failed(deployment: str) -> ReplicaFailed:
        replica = ReplicaStatus(replica_id=f"{deployment}-1", deployment=deployment,
                                revision="1", state="failed")  # fmt: skip
        return ReplicaFailed(cluster="use1-a", source="cluster/use1-a", replica=replica)

    assert await sink.record_fact("use1-a", failed("chat-llm"), datetime.now(UTC)) == []
    assert admin.get("events", type="ReportRejected").json()["items"] == []
    rejected = await sink.record_fact("use1-a", failed("never-given"), datetime.now(UTC))
    assert rejected == ["deployment_not_given"]
    assert len(admin.get("events", type="ReportRejected").json()["items"]) == 1
    assert admin.get("replicas", cluster="use1-a").json()["items"] == []


async def test_a_heartbeat_older_than_the_one_recorded_changes_nothing(admin, session_factory):
    """Heartbeats can arrive out of order (a redelivery is dated when the stream stored
    it): the plane's newest state stands, not the last to arrive."""
    b.seed(admin)
    sink = DbSink(session_factory, on_change=lambda reason: None)
    now = datetime.now(UTC)
    newer = ObservedState(cluster="use1-a", source="cluster/use1-a", agent_version="2.0")
    older = ObservedState(cluster="use1-a", source="cluster/use1-a", agent_version="1.0")
    await sink.record_observed("use1-a", newer, now)
    await sink.record_observed("use1-a", older, now - timedelta(seconds=2))
    status = admin.get("clusters/use1-a").json()["status"]
    assert status["agent_version"] == "2.0"
    assert datetime.fromisoformat(status["last_heartbeat_at"]) == now


async def test_a_plane_flooding_facts_is_held_to_its_budget_and_its_heartbeats_still_count(
    admin, session_factory
):
    """Each fact with a fresh id was an event row (and, for some kinds, a re-plan): a plane
    looping on facts grew the database without bound."""
    from controlplane.trust import Bounds

    b.seed(admin)
    admin.post("deployments", b.deployment())
    sink = DbSink(session_factory, bounds=Bounds(facts_per_s=1.0, facts_burst=5.0))
    at = datetime.now(UTC)

    def scaled(i: int) -> ReplicasScaled:
        return ReplicasScaled(cluster="use1-a", source="cluster/use1-a", deployment="chat-llm",
                              from_replicas=i, to_replicas=i + 1, reason="flood")  # fmt: skip

    verdicts = [await sink.record_fact("use1-a", scaled(i), at) for i in range(20)]
    assert verdicts == [[]] * 5 + [["fact_rate"]] * 15
    assert await sink.record_fact("use1-a", scaled(99), at + timedelta(seconds=2)) == []
    with session_factory() as s:
        events = s.scalars(select(m.Event).where(m.Event.type == "ReplicasScaled")).all()
    assert len(events) == 6  # the burst, then one a second
    beat = ObservedState(cluster="use1-a", source="cluster/use1-a")
    assert await sink.record_observed("use1-a", beat, at) == []  # not held by the budget
    assert admin.get("clusters/use1-a").json()["status"]["state"] == "healthy"


async def test_a_plane_looping_on_heartbeats_is_held_to_its_budget(admin, session_factory):
    """Each heartbeat was a database transaction in the one consumer all planes share: a
    plane publishing them in a loop delayed every other plane's reports."""
    from controlplane.trust import Bounds

    b.seed(admin)
    sink = DbSink(session_factory, bounds=Bounds(heartbeats_per_s=1.0, heartbeats_burst=3.0))
    at = datetime.now(UTC)

    def beat(version: str) -> ObservedState:
        return ObservedState(cluster="use1-a", source="cluster/use1-a", agent_version=version)

    verdicts = [await sink.record_observed("use1-a", beat(f"v{i}"), at) for i in range(8)]
    assert verdicts == [[]] * 3 + [["heartbeat_rate"]] * 5
    assert admin.get("clusters/use1-a").json()["status"]["agent_version"] == "v2"
    later = at + timedelta(seconds=1)
    assert await sink.record_observed("use1-a", beat("v9"), later) == []  # a second later
    status = admin.get("clusters/use1-a").json()["status"]
    assert status["agent_version"] == "v9" and status["state"] == "healthy"


async def test_a_fact_dated_before_year_one_is_kept_and_every_read_of_events_still_works(
    admin, session_factory
):
    """Year 1 at +01:00 is before year 1 in UTC: PostgreSQL stored it, the driver could not
    read it back, and every page of events (and the events webhook) failed from then on."""
    import json

    from controlplane.contracts import decode_report

    b.seed(admin)
    admin.post("deployments", b.deployment())
    raw = json.dumps({
        "type": "replicas_scaled", "source": "cluster/use1-a", "cluster": "use1-a",
        "time": "0001-01-01T00:00:00+01:00", "deployment": "chat-llm",
        "from_replicas": 1, "to_replicas": 2, "reason": "forged time",
    }).encode()  # fmt: skip
    fact = decode_report(raw)
    assert isinstance(fact, ReplicasScaled)
    await DbSink(session_factory).record_fact("use1-a", fact, datetime.now(UTC))
    answer = admin.get("events", object_name="chat-llm")
    assert answer.status_code == 200
    [event] = answer.json()["items"]
    assert event["type"] == "ReplicasScaled" and event["occurred_at"].startswith("1970-01-01")
