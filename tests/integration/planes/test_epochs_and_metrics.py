"""Issue 12 item 10 on real PostgreSQL and NATS: a snapshot with a generation the control
plane never issued does not wedge a plane (a new epoch takes it back); the rejected-message
counters are served over HTTP (bus process, agent via its router); events keep the time a
fact happened; deleted deployments are listed as retired.

The control plane's bus side (`run_bus`) and an agent (memory runtime, with its router) run
in this process; NATS runs with the authorization config that `gpufleet up` uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import nats
import pytest
from sqlalchemy import select

from controlplane.bus import (
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.bus_process import run_bus
from controlplane.contracts import (
    DESIRED_BUCKET,
    CapacityExhausted,
    DesiredState,
    NatsCredentials,
    desired_key,
    encode,
    observed_subject,
)
from controlplane.db import models as m
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from controlplane.services.desired import bump_desired, desired_state
from controlplane.services.observed import DbSink
from controlplane.services.placement import replan
from controlplane.settings import Settings
from tests.integration.api import builders as b
from tests.integration.bus.conftest import eventually
from workloadplane.agent import Agent, serve
from workloadplane.router.core import Router
from workloadplane.runtime.memory import InMemoryRuntime
from workloadplane.state import DesiredStateStore

CLUSTER = "use1-a"


@pytest.fixture
def fleet(admin) -> dict[str, str]:
    """One provider/region/pool, a cluster (its NATS password is shown once) and a deployment."""
    for path, body in (("providers", b.provider()), ("regions", b.region()), ("gpu-types", b.gpu_type()),
                       ("pools", b.pool())):  # fmt: skip
        assert admin.post(path, body).status_code == 201
    cluster = admin.post("clusters", b.cluster()).json()
    deployment = b.deployment(autoscaling={"min_replicas": 1, "max_replicas": 4})
    assert admin.post("deployments", deployment).status_code == 201
    return cluster["nats_credentials"]


@dataclass
class Planes:
    nats_url: str
    controlplane: NatsCredentials
    cluster: NatsCredentials
    agent: Agent
    runtime: InMemoryRuntime
    router_url: str
    bus_metrics_url: str


@asynccontextmanager
async def planes(
    fleet,
    session_factory,
    database_url,
    tmp_path: Path,
    monkeypatch,
    *,
    router: bool = False,
    with_agent: bool = True,
) -> AsyncIterator[Planes]:
    """NATS as `up` configures it, the bus process (metrics on a free port) and the agent
    (with its router on a free port when ``router``: the memory runtime's replicas have no
    real endpoints, so only where no replica is placed)."""
    controlplane = generate_controlplane_credentials()
    with session_factory() as s:
        row = s.scalars(select(m.Cluster)).one()
        users = {row.name: NatsCredentials(user=row.nats_user, password=row.nats_password_hash)}
    port = free_port()
    config = write_server_config(tmp_path / "nats.conf", render_server_config(
        controlplane=controlplane, clusters=users, store_dir=tmp_path / "js", port=port))  # fmt: skip
    server = NatsServer(store_dir=tmp_path / "js", port=port, config_file=config).start()
    monkeypatch.setenv("GPUFLEET_NATS_USER", controlplane.user)
    monkeypatch.setenv("GPUFLEET_NATS_PASSWORD", controlplane.password)
    monkeypatch.setattr("controlplane.bus_process.trigger_replan", lambda reason: None)
    metrics_port, router_port = free_port(), free_port()
    settings = Settings(
        database_url=database_url, nats_url=server.url, bus_metrics_port=metrics_port
    )
    plane_router = Router() if router else None
    runtime = InMemoryRuntime()
    store = DesiredStateStore(tmp_path / "agent", fsync=False)
    agent = Agent(CLUSTER, runtime, store, router=plane_router)
    stop_bus, stop_agent = asyncio.Event(), asyncio.Event()
    creds = NatsCredentials.model_validate(fleet)
    agent_served = serve(
        agent,
        server.url,
        creds,
        heartbeat_interval=0.2,
        reconcile_interval=0.1,
        stop=stop_agent,
        router_address=("127.0.0.1", router_port),
    )
    tasks = [asyncio.create_task(run_bus(settings, stop_bus, poll_s=0.05))]
    if with_agent:
        tasks.append(asyncio.create_task(agent_served))
    else:
        agent_served.close()
    try:
        yield Planes(
            server.url,
            controlplane,
            creds,
            agent,
            runtime,
            f"http://127.0.0.1:{router_port}",
            f"http://127.0.0.1:{metrics_port}",
        )
    finally:
        stop_agent.set()
        stop_bus.set()
        # bounded: CI once hung here for 300 s (session 23); name what did not stop
        done, late = await asyncio.wait(tasks, timeout=60)
        for task in done:  # retrieved, as gather(return_exceptions=True) did
            if not task.cancelled():
                task.exception()
        for task in late:
            task.print_stack()
            task.cancel()
        if late:  # (a task that swallows its cancellation must not hang the suite either)
            await asyncio.wait(late, timeout=5)
        server.stop()
        assert not late, f"did not stop within 60 s of being asked: {late}"


def _cluster(factory) -> m.Cluster:
    with factory() as s:
        return s.scalars(select(m.Cluster)).one()


def _replan(factory) -> None:
    with factory() as s, s.begin():
        assert replan(s, "test") is not None


async def _kv_put(p: Planes, data: bytes) -> None:
    conn = await nats.connect(p.nats_url, **p.controlplane.connect_options())  # type: ignore[arg-type]
    try:
        kv = await conn.jetstream().key_value(DESIRED_BUCKET)
        await kv.put(desired_key(CLUSTER), data)
    finally:
        await conn.close()


async def _metric(url: str, name: str, reason: str) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics", timeout=5)).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_a_generation_never_issued_does_not_wedge_the_plane(
    fleet, admin, session_factory, database_url, tmp_path: Path, monkeypatch
):
    async with planes(fleet, session_factory, database_url, tmp_path, monkeypatch) as p:
        await eventually(lambda: _cluster(session_factory).state == "healthy", 15, "a heartbeat")
        _replan(session_factory)
        await eventually(lambda: p.agent.applied_generation >= 1, 15, "the first placement")
        assert p.agent.desired is not None
        forged = p.agent.desired.model_copy(update={"generation": 10**12, "deployments": []})
        await _kv_put(p, encode(forged))
        await eventually(lambda: p.agent.applied_generation == 10**12, 15, "the forged snapshot")

        # a normal change afterwards: the deployment goes to 3 replicas
        assert admin.patch("deployments/chat-llm", {"autoscaling": {"min_replicas": 3}},
                           **{"Content-Type": "application/merge-patch+json"}).status_code == 200  # fmt: skip
        _replan(session_factory)

        async def three_running() -> bool:
            return len(await p.runtime.list_replicas()) == 3

        await eventually(three_running, 45, "the change made after the forgery to apply")
        cluster = _cluster(session_factory)
        assert cluster.desired_epoch >= 1
        assert p.agent.applied_epoch == cluster.desired_epoch
        assert p.agent.applied_generation <= cluster.desired_generation
        await eventually(
            lambda: (
                _cluster(session_factory).observed_generation
                == _cluster(session_factory).desired_generation
            ),
            15,
            "the acknowledgement of the new epoch",
        )
        with session_factory() as s:
            started = s.scalars(select(m.Event).where(m.Event.type == "DesiredEpochStarted")).all()
        assert started and "never issued" in started[0].message
        assert started[0].data["seen"] == {"epoch": 0, "generation": 10**12}


async def test_the_publisher_out_numbers_a_kv_entry_it_never_wrote(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    """No agent acknowledges anything here: the bus process alone finds the KV entry ahead."""
    with session_factory() as s, s.begin():  # (nothing placed: no heartbeat without an agent)
        bump_desired(s, [s.scalars(select(m.Cluster.id)).one()])
    async with planes(
        fleet, session_factory, database_url, tmp_path, monkeypatch, with_agent=False
    ) as p:
        conn = await nats.connect(p.nats_url, **p.controlplane.connect_options())  # type: ignore[arg-type]
        try:

            async def stored() -> DesiredState | None:
                try:  # (the bus process creates the bucket when it starts)
                    kv = await conn.jetstream().key_value(DESIRED_BUCKET)
                    entry = await kv.get(desired_key(CLUSTER))
                except Exception:
                    return None
                return DesiredState.model_validate_json(entry.value or b"")

            async def published() -> bool:
                return (await stored()) is not None

            await eventually(published, 15, "generation 2 published")
            first = await stored()  # a cluster is created at generation 1, bumped once here
            assert first is not None and first.version == (0, 2)
            kv = await conn.jetstream().key_value(DESIRED_BUCKET)
            await kv.put(
                desired_key(CLUSTER), encode(first.model_copy(update={"generation": 10**12}))
            )
            with session_factory() as s, s.begin():
                bump_desired(s, [s.scalars(select(m.Cluster.id)).one()])

            async def new_epoch() -> bool:
                state = await stored()
                return state is not None and state.epoch == 1

            await eventually(new_epoch, 15, "the snapshot republished in a new epoch")
            latest = await stored()
            assert latest is not None and latest.version == (1, 4)
            cluster = _cluster(session_factory)
            assert (cluster.desired_epoch, cluster.desired_generation) == (1, 4)
        finally:
            await conn.close()


async def test_rejected_messages_are_counted_on_both_metrics_endpoints(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    async with planes(
        fleet, session_factory, database_url, tmp_path, monkeypatch, router=True
    ) as p:
        await eventually(lambda: _cluster(session_factory).state == "healthy", 15, "a heartbeat")
        agent_before = await _metric(p.router_url, "gpufleet_agent_rejected_messages_total",
                                     "malformed")  # fmt: skip
        bus_before = await _metric(p.bus_metrics_url, "gpufleet_bus_rejected_messages_total",
                                   "malformed")  # fmt: skip
        await _kv_put(p, b"{not json")
        conn = await nats.connect(p.nats_url, **p.cluster.connect_options())  # type: ignore[arg-type]
        try:
            await conn.jetstream().publish(observed_subject(CLUSTER), b"\x00 not json")
        finally:
            await conn.close()

        async def counted() -> bool:
            return (
                await _metric(p.router_url, "gpufleet_agent_rejected_messages_total", "malformed")
                >= agent_before + 1  # the registry is the process's: other tests count too
                and await _metric(
                    p.bus_metrics_url, "gpufleet_bus_rejected_messages_total", "malformed"
                )
                >= bus_before + 1
            )

        await eventually(counted, 45, "both rejections served on /metrics")


async def test_an_event_keeps_the_time_its_fact_happened(admin, fleet, session_factory):
    sink = DbSink(session_factory)
    received = datetime.now(UTC)
    late = CapacityExhausted(cluster=CLUSTER, source=f"cluster/{CLUSTER}", deployment="d-1",
                             time=received - timedelta(seconds=90))  # fmt: skip
    ahead = CapacityExhausted(cluster=CLUSTER, source=f"cluster/{CLUSTER}", deployment="d-2",
                              time=received + timedelta(hours=3))  # fmt: skip
    for fact in (late, ahead):
        await sink.record_fact(CLUSTER, fact, received)
    listed = admin.get("events", type="CapacityExhausted").json()["items"]
    events = {e["id"]: e for e in listed}
    shown = {
        k: (datetime.fromisoformat(e["time"]), datetime.fromisoformat(e["occurred_at"]))
        for k, e in events.items()
    }
    assert shown[str(late.id)] == (received, late.time), "late: both times, 90 s apart"
    time, occurred = shown[str(ahead.id)]
    assert time == received and occurred <= received + timedelta(seconds=5), "not in the future"


def test_a_deleted_deployment_is_listed_as_retired(admin, fleet, session_factory):
    assert admin.post("deployments", b.deployment("gone-llm")).status_code == 201
    assert admin.delete("deployments/gone-llm").status_code in (200, 204)
    with session_factory() as s, s.begin():  # (nothing placed: no heartbeat yet)
        bump_desired(s, [s.scalars(select(m.Cluster.id)).one()])
    with session_factory() as s:
        cluster = s.scalars(select(m.Cluster)).one()
        assert desired_state(s, cluster).retired == ["gone-llm"]
    # created again under the same name, it is not retired any more
    assert admin.post("deployments", b.deployment("gone-llm")).status_code == 201
    with session_factory() as s:
        cluster = s.scalars(select(m.Cluster)).one()
        snapshot: DesiredState = desired_state(s, cluster)
        assert snapshot.retired == []
        assert snapshot.epoch == cluster.desired_epoch == 0
