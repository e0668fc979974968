"""Placement on the real database: the demo fleet placed, explained, previewed, published."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.contracts import ReplicaStarted, ReplicaStatus
from controlplane.db import models as m
from controlplane.db.session import transaction
from controlplane.procurement import facts as procurement
from controlplane.services.desired import desired_state
from controlplane.services.inventory import Actor
from controlplane.services.manifests import apply_manifests
from controlplane.services.observed import DbSink
from controlplane.services.placement import replan

FLEET = Path(__file__).resolve().parents[3] / "infra" / "examples" / "fleet.yaml"


@pytest.fixture
def demo(admin, session_factory):
    """The demo fleet with every cluster's agent heartbeating (healthy)."""
    docs = [d for d in yaml.safe_load_all(FLEET.read_text()) if d]
    with session_factory() as s, s.begin():
        apply_manifests(s, docs, Actor("test"))
        s.execute(update(m.Cluster).values(state="healthy"))
    return admin


def _placed(api, deployment: str) -> list[dict]:
    return api.get("placement").json()["deployments"][deployment]["assignments"]


def test_replan_places_every_demo_deployment_within_its_policy(demo, operator):
    result = operator.post("placement/replan", {})
    assert result.status_code == 200, result.text

    eu = _placed(demo, "eu-assistant")
    assert {a["cluster"] for a in eu} == {"euc1-a"}  # DE only, though US is cheaper
    triage = _placed(demo, "triage-llm")
    assert {a["pool"] for a in triage} <= {"aws-use1-h100-reserved", "aws-use1-h100-od"}
    assert sum(a["replicas"] for a in triage) == 2
    # reserved capacity first: the 16 reserved H100s carry triage before on-demand does
    assert {a["pool"] for a in triage} == {"aws-use1-h100-reserved"}

    rows = demo.get("placements").json()["items"]
    assert sum(r["replicas"] for r in rows) >= 4
    assert demo.get("events", type="PlacementChanged").json()["items"]
    assert float(demo.get("placement").json()["total_cost_per_hour"]) > 0


def test_an_unchanged_world_replans_to_the_same_placement(demo, operator, session_factory):
    operator.post("placement/replan", {})
    with session_factory() as s:
        generations = dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())
    operator.post("placement/replan", {})
    with session_factory() as s:
        again = dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())
    assert again == generations
    assert len(demo.get("events", type="PlacementChanged").json()["items"]) == 1


def test_preview_of_a_cluster_down_explains_without_saving(demo, operator):
    operator.post("placement/replan", {})
    before = demo.get("placement").json()
    preview = demo.post(
        "placement/preview", {"changes": [{"kind": "cluster", "name": "euc1-a", "state": "down"}]}
    )
    assert preview.status_code == 200, preview.text
    eu = preview.json()["deployments"]["eu-assistant"]
    assert eu["placed_replicas"] == 0
    reason = eu["unplaced"][0]["reason"]
    assert "DE" in reason and "to fix" in reason
    assert any(m_["deployment"] == "eu-assistant" for m_ in preview.json()["moves"])
    assert float(preview.json()["cost_delta_per_hour"]) < 0  # the DE replicas stop costing
    assert demo.get("placement").json() == before  # nothing saved

    unknown = demo.post(
        "placement/preview", {"changes": [{"kind": "pool", "name": "nope", "removed": True}]}
    )
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["field"] == "changes[0].name"


def test_only_one_replan_runs_at_a_time(demo, session_factory):
    with session_factory() as holder, holder.begin():
        holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": 0x6770_666C})
        with session_factory() as other, other.begin():
            assert replan(other, "test") is None


def test_the_desired_state_of_a_cluster_carries_its_placed_deployments(
    demo, operator, session_factory
):
    operator.post("placement/replan", {})
    with session_factory() as s:
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "euc1-a")).one()
        state = desired_state(s, cluster)
    assert state.generation == cluster.desired_generation >= 1
    [eu] = state.deployments
    assert eu.name == "eu-assistant"
    assert eu.spec.gpus_per_replica == 2
    assert eu.quota.max >= eu.quota.min >= 1
    assert eu.pools == ["aws-euc1-h100-od"]
    [quota] = eu.pool_quotas
    assert (quota.pool, quota.min, quota.max) == ("aws-euc1-h100-od", eu.quota.min, eu.quota.max)


def test_a_spot_notice_reaches_the_clusters_desired_state_as_a_draining_instance(
    demo, operator, session_factory
):
    operator.post("placement/replan", {})
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    with transaction(session_factory) as s:
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "euc1-a")).one()
        pool = s.scalars(select(m.Pool).where(m.Pool.name == "aws-euc1-h100-od")).one()
        for iid in ("i-1", "i-2"):
            s.add(m.Instance(pool_id=pool.id, cluster_id=cluster.id, provider_instance_id=iid,
                             idempotency_key=f"test-{iid}", gpus=8, state="running"))  # fmt: skip
        s.flush()
        before = cluster.desired_generation
        assert procurement.note_interruption(s, "i-1", deadline, datetime.now(UTC), "test")
    with session_factory() as s:
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "euc1-a")).one()
        state = desired_state(s, cluster)
    assert cluster.desired_generation > before, "the agent must hear of it"
    assert [(i.id, i.pool, i.gpus, i.draining, i.drain_deadline) for i in state.instances] == [
        ("i-1", "aws-euc1-h100-od", 8, True, deadline),
        ("i-2", "aws-euc1-h100-od", 8, False, None),
    ]


def test_a_waiting_replan_runs_once_the_running_one_is_done(demo, session_factory):
    import threading

    holder = session_factory()
    holder.begin()
    holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": 0x6770_666C})
    results = []

    def waiter() -> None:
        with session_factory() as s, s.begin():
            results.append(replan(s, "spot notice", wait_s=10))

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # waiting for the lock, not giving up
    holder.rollback()
    holder.close()
    thread.join(10)
    assert results
    assert results[0] is not None


def named(s: Session, model: type[Any], name: str) -> Any:
    return s.scalars(select(model).where(model.name == name)).one()


def seed_leaving(factory: sessionmaker[Session], leaving_on: str, pool: str) -> None:
    """eu-assistant with all its placed replicas ready: one on a draining instance of
    `leaving_on` (in `pool`), the others on euc1-a."""
    with transaction(factory) as s:
        dep = named(s, m.Deployment, "eu-assistant")
        placed = sum(s.scalars(select(m.Placement.replicas)
                               .where(m.Placement.deployment_id == dep.id)))  # fmt: skip
        assert placed >= 1
        cluster = named(s, m.Cluster, leaving_on)
        victim = m.Instance(pool_id=named(s, m.Pool, pool).id, cluster_id=cluster.id,
                            provider_instance_id="i-v", idempotency_key="test-i-v", gpus=8,
                            state="draining")  # fmt: skip
        s.add(victim)
        s.flush()
        s.add(m.Replica(name="r-leaving", deployment_id=dep.id, cluster_id=cluster.id,
                        state="ready", instance_id=victim.id))  # fmt: skip
        eu = named(s, m.Cluster, "euc1-a")
        for i in range(placed - 1):
            s.add(m.Replica(name=f"r-{i}", deployment_id=dep.id, cluster_id=eu.id,
                            state="ready"))  # fmt: skip


def eu_assistant_on(factory: sessionmaker[Session], cluster: str) -> tuple[int, list[Any]]:
    """The cluster's desired generation and eu-assistant's entries in its desired state."""
    with factory() as s:
        row = named(s, m.Cluster, cluster)
        found = [d for d in desired_state(s, row).deployments if d.name == "eu-assistant"]
        return row.desired_generation, found


async def replacement_ready(factory: sessionmaker[Session]) -> None:
    """euc1-a reports a new eu-assistant replica ready (as its agent's fact would)."""
    replica = ReplicaStatus(replica_id="r-new", deployment="eu-assistant", revision="1",
                            state="ready")  # fmt: skip
    fact = ReplicaStarted(cluster="euc1-a", source="cluster/euc1-a", replica=replica)
    await DbSink(factory, on_change=lambda reason: None).record_fact(
        "euc1-a", fact, datetime.now(UTC)
    )


async def test_a_replica_on_a_draining_instance_is_held_until_a_replacement_is_ready(
    demo, operator, session_factory
):
    """The replacement may start on another cluster, which the draining one cannot see:
    the control plane holds the leaving replica and lets it go when enough are ready."""
    operator.post("placement/replan", {})
    seed_leaving(session_factory, "euc1-a", "aws-euc1-h100-od")
    generation, [eu] = eu_assistant_on(session_factory, "euc1-a")
    assert eu.hold_leaving == 1, "one short elsewhere: keep it serving"
    await replacement_ready(session_factory)
    later, [eu] = eu_assistant_on(session_factory, "euc1-a")
    assert later > generation, "the agent hears that the hold is over"
    assert eu.hold_leaving == 0


async def test_a_cluster_the_deployment_left_keeps_its_held_replica_until_the_replacement(
    demo, operator, session_factory
):
    """The last replica of a deployment on a cluster sat on the interrupted instance: the
    placement no longer names that cluster, but its desired state keeps the deployment
    (quota 0, hold 1) so the replica serves until the replacement is ready elsewhere."""
    operator.post("placement/replan", {})
    seed_leaving(session_factory, "use1-a", "aws-use1-l40s-spot")
    _, [held] = eu_assistant_on(session_factory, "use1-a")
    assert (held.quota.min, held.quota.max, held.hold_leaving) == (0, 0, 1)
    await replacement_ready(session_factory)
    _, gone = eu_assistant_on(session_factory, "use1-a")
    assert gone == [], "replacement ready: the deployment leaves use1-a"


async def test_replicas_a_dead_cluster_last_reported_do_not_end_a_hold(
    demo, operator, session_factory
):
    """A down cluster's replica rows stay as it last reported them: counted as ready, they
    made a replica on a draining instance stop before its replacement was up anywhere."""
    operator.post("placement/replan", {})
    seed_leaving(session_factory, "euc1-a", "aws-euc1-h100-od")
    with transaction(session_factory) as s:  # a ghost: use1-a died after reporting it ready
        dep = named(s, m.Deployment, "eu-assistant")
        dead = named(s, m.Cluster, "use1-a")
        dead.state = "down"
        s.add(m.Replica(name="r-ghost", deployment_id=dep.id, cluster_id=dead.id,
                        state="ready"))  # fmt: skip
    _, [eu] = eu_assistant_on(session_factory, "euc1-a")
    assert eu.hold_leaving == 1, "the dead plane's replica serves nobody: keep holding"
