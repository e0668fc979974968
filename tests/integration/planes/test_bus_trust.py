"""Issue 12 items 2 and 4 on real PostgreSQL and NATS, with the bus's consumer, its progress
bookkeeping and an agent (memory runtime) in this process.

Item 2: liveness counts silence only while the bus could hear (a stopped consumer or a
dead bus process suspends it); most clusters silent at once trips the breaker.
Item 4: a plane's report counts only for what it was given; the spend guard bounds what
reported demand may buy.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import nats
import pytest
from nats.aio.client import Client
from sqlalchemy import select

from controlplane.bus import ensure_bus, render_server_config, write_server_config
from controlplane.bus.consumer import REJECTED, ReportConsumer
from controlplane.bus_process import keep_progress
from controlplane.contracts import (
    DeploymentObserved,
    NatsCredentials,
    ObservedState,
    ReplicaStatus,
    observed_subject,
)
from controlplane.credentials import generate_controlplane_credentials
from controlplane.db import models as m
from controlplane.db.session import transaction
from controlplane.liveness import Breaker
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from controlplane.services.clusters import record_bus_progress, update_liveness
from controlplane.services.observed import DbSink
from controlplane.services.placement import replan
from controlplane.spend import SpendLimits
from tests.integration.api import builders as b
from tests.integration.bus.conftest import eventually
from workloadplane.agent import run_agent
from workloadplane.runtime.memory import InMemoryRuntime

STALE, DOWN = timedelta(seconds=1), timedelta(seconds=2)
SOLO = Breaker(fraction=0.5, min_clusters=2)  # one cluster alone never trips it


@dataclass
class Planes:
    server: NatsServer
    controlplane: NatsCredentials
    clusters: dict[str, NatsCredentials]


@pytest.fixture
async def planes(admin, session_factory, tmp_path: Path) -> AsyncIterator[Planes]:
    """use1-a and use1-b on one on-demand pool each, chat-llm placed on use1-a only
    (min = max = 1), and a NATS server with every cluster's user."""
    for path, body in (("providers", b.provider()), ("regions", b.region()),
                       ("gpu-types", b.gpu_type()), ("pools", b.pool()),
                       ("pools", b.pool("aws-use1-h100-od-b"))):  # fmt: skip
        assert admin.post(path, body).status_code == 201
    creds: dict[str, NatsCredentials] = {}
    for cluster in (b.cluster(), b.cluster("use1-b", pools=["aws-use1-h100-od-b"])):
        answer = admin.post("clusters", cluster)
        assert answer.status_code == 201, answer.text
        creds[cluster["name"]] = NatsCredentials.model_validate(answer.json()["nats_credentials"])
    with session_factory() as s:
        users = {
            c.name: NatsCredentials(user=c.nats_user or "", password=c.nats_password_hash or "")
            for c in s.scalars(select(m.Cluster))
        }
    controlplane = generate_controlplane_credentials()
    port = free_port()
    config = write_server_config(tmp_path / "nats.conf", render_server_config(
        controlplane=controlplane, clusters=users, store_dir=tmp_path / "js", port=port))  # fmt: skip
    server = NatsServer(store_dir=tmp_path / "js", port=port, config_file=config).start()
    try:
        yield Planes(server, controlplane, creds)
    finally:
        server.stop()


async def _connect(planes: Planes, creds: NatsCredentials) -> Client:
    return await nats.connect(planes.server.url, **creds.connect_options())


def _cluster(factory, name: str = "use1-a") -> m.Cluster:
    with factory() as s:
        return s.scalars(select(m.Cluster).where(m.Cluster.name == name)).one()


def _events(factory, kind: str) -> list[m.Event]:
    with factory() as s:
        return list(s.scalars(select(m.Event).where(m.Event.type == kind).order_by(m.Event.time)))


class ManualClock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now


def _progress(factory) -> m.BusProgress | None:
    with factory() as s:
        return s.scalars(select(m.BusProgress)).first()


def _judge(factory, now: datetime, breaker: Breaker = SOLO) -> list[str]:
    with transaction(factory) as s:
        return update_liveness(s, now, STALE, DOWN, breaker)


async def test_a_stopped_consumer_is_not_taken_for_the_planes_death(
    planes, session_factory, tmp_path: Path
):
    """The bus's consumer stops while the agent keeps publishing: the cluster stays as it
    was and liveness says why once; real silence later still marks it down."""
    clock = ManualClock()
    nc = await _connect(planes, planes.controlplane)
    js = nc.jetstream()
    await ensure_bus(js)
    # what was pushed to the stopped subscription comes back after ack_wait (30 s by default)
    consumer = ReportConsumer(js, DbSink(session_factory), clock=clock, ack_wait_s=1.0)
    await consumer.start()
    stop, stop_agent = asyncio.Event(), asyncio.Event()
    keeping = asyncio.create_task(keep_progress(consumer, session_factory, 0.05, stop, clock=clock))
    agent = asyncio.create_task(run_agent(
        "use1-a", planes.server.url, planes.clusters["use1-a"], tmp_path / "agent",
        InMemoryRuntime(), heartbeat_interval=0.1, reconcile_interval=0.1, stop=stop_agent,
        fsync=False))  # fmt: skip

    def progressed(caught_up: bool) -> bool:
        row = _progress(session_factory)
        if row is None or row.alive_at != clock.now:
            return False
        return (row.caught_up_at == clock.now) == caught_up

    try:
        await eventually(lambda: _cluster(session_factory).state == "healthy", 15, "a heartbeat")
        await consumer.stop()  # frozen: nobody reads the reports any more
        plane = await _connect(planes, planes.clusters["use1-a"])  # and the plane speaks on
        beat = ObservedState(cluster="use1-a", source="cluster/use1-a")
        await plane.jetstream().publish(observed_subject("use1-a"), beat.model_dump_json().encode())
        await plane.close()
        clock.now += DOWN + timedelta(seconds=1)
        await eventually(lambda: progressed(caught_up=False), 10, "the backlog to be recorded")
        assert _judge(session_factory, clock.now) == []
        assert _judge(session_factory, clock.now) == []
        assert _cluster(session_factory).state == "healthy"
        (suspended,) = _events(session_factory, "LivenessSuspended")
        assert "behind the reports stream" in suspended.message

        await consumer.start()  # the backlog is read: heartbeats flow again
        clock.now += timedelta(seconds=1)
        await eventually(lambda: progressed(caught_up=True), 10, "the consumer to catch up")
        assert _judge(session_factory, clock.now) == []
        assert [e.type for e in _events(session_factory, "LivenessResumed")] == ["LivenessResumed"]

        stop_agent.set()  # now the plane really goes silent, and the bus hears the silence
        await agent
        # its last heartbeats are read before the clock moves on (one read after it would
        # count as heard at the later time: CI once found the plane alive there)
        await eventually(lambda: progressed(caught_up=True), 10, "the last heartbeats read")
        clock.now += DOWN + timedelta(seconds=1)
        await eventually(lambda: progressed(caught_up=True), 10, "the consumer to be caught up")
        assert _judge(session_factory, clock.now) == ["use1-a"]
        assert _events(session_factory, "ClusterDown")[0].object_name == "use1-a"
    finally:
        stop_agent.set()
        stop.set()
        await asyncio.gather(agent, keeping, return_exceptions=True)
        with contextlib.suppress(Exception):
            await consumer.stop()
        await nc.close()


def _beat(factory, cluster: str, at: datetime) -> None:
    with transaction(factory) as s:
        row = s.scalars(select(m.Cluster).where(m.Cluster.name == cluster)).one()
        row.last_heartbeat_at, row.state = at, "healthy"


def _bus_at(factory, at: datetime) -> None:
    with transaction(factory) as s:
        record_bus_progress(s, "gpufleet-controlplane", at, at, 10, 10, 0)


def test_a_dead_bus_process_suspends_liveness_and_says_so_once(planes, session_factory):
    t0 = datetime.now(UTC)
    for cluster in ("use1-a", "use1-b"):
        _beat(session_factory, cluster, t0)
    _bus_at(session_factory, t0)  # its last word: then nothing
    for seconds in (3, 30, 300):
        assert _judge(session_factory, t0 + timedelta(seconds=seconds)) == []
    (suspended,) = _events(session_factory, "LivenessSuspended")
    assert "no progress for 3 s (frozen or dead)" in suspended.message
    assert {_cluster(session_factory, c).state for c in ("use1-a", "use1-b")} == {"healthy"}


def test_most_clusters_silent_at_once_trips_the_breaker_until_heartbeats_flow(
    planes, session_factory
):
    t0 = datetime.now(UTC)
    for cluster in ("use1-a", "use1-b"):
        _beat(session_factory, cluster, t0)
    later = t0 + DOWN + timedelta(seconds=1)
    _bus_at(session_factory, later)  # the bus is caught up: the silence is real, or is it?
    assert _judge(session_factory, later, Breaker(0.5, 2)) == []
    assert _judge(session_factory, later, Breaker(0.5, 2)) == []
    assert {_cluster(session_factory, c).state for c in ("use1-a", "use1-b")} == {"stale"}
    (suspended,) = _events(session_factory, "LivenessSuspended")
    assert "2 of 2 clusters (use1-a, use1-b) went silent at once" in suspended.message
    assert _events(session_factory, "ClusterDown") == []

    for cluster in ("use1-a", "use1-b"):
        _beat(session_factory, cluster, later + timedelta(seconds=1))
    _bus_at(session_factory, later + timedelta(seconds=1))
    assert _judge(session_factory, later + timedelta(seconds=1), Breaker(0.5, 2)) == []
    assert len(_events(session_factory, "LivenessResumed")) == 1


# --- item 4: what a plane may claim ---------------------------------------------------------


async def _placed(admin, factory, deployment: dict) -> tuple[str, str]:
    """Both clusters heard from, `deployment` created and placed: (where it runs, the other)."""
    now = datetime.now(UTC)
    for cluster in ("use1-a", "use1-b"):
        hello = ObservedState(cluster=cluster, source=f"cluster/{cluster}")
        await DbSink(factory).record_observed(cluster, hello, now)
    assert admin.post("deployments", deployment).status_code == 201
    with transaction(factory) as s:
        assert replan(s, "test") is not None
    with factory() as s:
        rows = s.execute(
            select(m.Cluster.name)
            .join(m.Placement, m.Placement.cluster_id == m.Cluster.id)
            .join(m.Deployment, m.Deployment.id == m.Placement.deployment_id)
            .where(m.Deployment.name == deployment["name"], m.Placement.replicas > 0)
        ).all()
    (runs_on,) = {r[0] for r in rows}
    return runs_on, next(c for c in ("use1-a", "use1-b") if c != runs_on)


def _rejected(reason: str) -> float:
    return REJECTED.labels(reason=reason)._value.get()


async def test_a_forged_heartbeat_moves_neither_demand_nor_replicas(admin, planes, session_factory):
    """A well-formed heartbeat on the forger's own subject claims demand and a ready replica
    for a deployment placed elsewhere: both rejected, its liveness still counts."""
    _, forger = await _placed(admin, session_factory, b.deployment())
    nc = await _connect(planes, planes.controlplane)
    js = nc.jetstream()
    await ensure_bus(js)
    consumer = ReportConsumer(js, DbSink(session_factory))
    await consumer.start()
    before = _rejected("deployment_not_given")
    forged = ObservedState(
        cluster=forger,
        source=f"cluster/{forger}",
        deployments=[DeploymentObserved(name="chat-llm", demand=6, in_flight=400)],
        replicas=[
            ReplicaStatus(replica_id="forged-1", deployment="chat-llm", revision="1", state="ready")
        ],
    )
    sent_at = _cluster(session_factory, forger).last_heartbeat_at
    plane = await _connect(planes, planes.clusters[forger])
    try:
        for _ in range(2):  # the second is counted but not told again within the minute
            fresh = forged.model_copy(update={"id": uuid4()})
            await plane.jetstream().publish(
                observed_subject(forger), fresh.model_dump_json().encode()
            )
        await eventually(lambda: _rejected("deployment_not_given") >= before + 4, 10, "rejections")
    finally:
        await plane.close()
        await consumer.stop()
        await nc.close()
    (event,) = _events(session_factory, "ReportRejected")
    assert event.object_name == forger
    assert event.data["reason"] == "deployment_not_given"
    with session_factory() as s:
        deployment = s.scalars(select(m.Deployment)).one()
        assert deployment.demand_replicas == 0
        assert s.scalars(select(m.Replica).where(m.Replica.name == "forged-1")).first() is None
    heard = _cluster(session_factory, forger).last_heartbeat_at
    assert heard is not None and sent_at is not None and heard > sent_at  # still alive


async def test_demand_beyond_its_bound_counts_as_the_bound(admin, planes, session_factory):
    runs_on, _ = await _placed(admin, session_factory, b.deployment())  # max_replicas 4
    huge = ObservedState(cluster=runs_on, source=f"cluster/{runs_on}",
                         deployments=[DeploymentObserved(name="chat-llm", demand=1000)])  # fmt: skip
    assert await DbSink(session_factory).record_observed(runs_on, huge, datetime.now(UTC)) == [
        "demand_bound"
    ]
    with session_factory() as s:
        assert s.scalars(select(m.Deployment)).one().demand_replicas == 8  # 2 × max_replicas
    (event,) = _events(session_factory, "ReportRejected")
    assert "demand 1000 above 8, counted as 8" in event.message


async def _big_one_wanting_six(admin, factory) -> None:
    """big-llm (8 GPUs a replica, 1–6) placed with 1, its plane reporting demand for 6."""
    big = b.deployment(
        "big-llm", gpus_per_replica=8, autoscaling={"min_replicas": 1, "max_replicas": 6}
    )
    runs_on, _ = await _placed(admin, factory, big)
    wants = ObservedState(cluster=runs_on, source=f"cluster/{runs_on}",
                          deployments=[DeploymentObserved(name="big-llm", demand=6)])  # fmt: skip
    await DbSink(factory).record_observed(runs_on, wants, datetime.now(UTC))


async def test_the_spend_guard_bounds_what_reported_demand_may_add(admin, planes, session_factory):
    await _big_one_wanting_six(admin, session_factory)
    limits = SpendLimits(gpus_per_deployment=16)

    def placed() -> int:
        with session_factory() as s:
            return sum(s.scalars(select(m.Placement.replicas)))

    for _ in range(2):  # the window remembers what it already added
        with transaction(session_factory) as s:
            assert replan(s, "demand", spend_limits=limits) is not None
        assert placed() == 3  # 1 + 16 GPUs' worth, not 6
    (event,) = _events(session_factory, "SpendGuardTriggered")
    assert event.object_name == "big-llm"
    assert event.data["bound"] == "gpus_per_deployment"
    assert "GPUFLEET_SPEND_GUARD_GPUS_PER_DEPLOYMENT" in event.message
    with transaction(session_factory) as s:
        assert replan(s, "demand") is not None  # the default bounds allow all 6
    assert placed() == 6


async def test_a_replan_asked_through_the_api_keeps_the_configured_spend_guard(
    admin, planes, session_factory
):
    """`POST /placement/replan` planned with the default bounds (and pruned the guard's
    record to the default window) whatever `GPUFLEET_SPEND_GUARD_*` said."""
    await _big_one_wanting_six(admin, session_factory)
    settings = admin.client.app.state.settings
    admin.client.app.state.settings = settings.model_copy(
        update={"spend_guard_gpus_per_deployment": 16}
    )
    assert admin.post("placement/replan", {}).status_code == 200
    with session_factory() as s:
        assert sum(s.scalars(select(m.Placement.replicas))) == 3  # 1 + 16 GPUs' worth, not 6
    (event,) = _events(session_factory, "SpendGuardTriggered")
    assert event.data["bound"] == "gpus_per_deployment"
