"""Issue 12 item 6 on real PostgreSQL and NATS with two in-process agents (memory runtimes
with 8 GPUs each): placement never counts more GPUs in a pool than its plane reports, a
plane's death does not move its deployment where it cannot start, and when the plane comes
back the deployment returns to it.

Cluster ``cheap`` draws on a reserved pool the inventory counts as 16 GPUs; its plane has 8.
Cluster ``dear`` draws on an on-demand pool of 8. Two deployments of 8 GPUs each: by the
inventory both fit on ``cheap`` (what the control plane did before), by the planes' reports
one goes to each. Re-plans are called here (the bus process's trigger is a no-op)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.bus import (
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.bus_process import run_bus
from controlplane.contracts import FreeCapacity, NatsCredentials, ObservedState, ReplicaStatus
from controlplane.db import models as m
from controlplane.db.columns import cluster_status
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from controlplane.services.observed import DbSink
from controlplane.services.placement import replan
from controlplane.settings import Settings
from tests.integration.api import builders as b
from tests.integration.bus.conftest import eventually
from workloadplane.agent import run_agent
from workloadplane.runtime.memory import InMemoryRuntime

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(admin) -> dict[str, dict]:
    """Two clusters (their NATS credentials, shown once) and two 8-GPU deployments."""
    for path, body in (
        ("providers", b.provider()),
        ("regions", b.region()),
        ("gpu-types", b.gpu_type()),
        ("pools", b.reserved_pool("cheap-rsv", gpus=16, committed_gpus=16)),
        ("pools", b.pool("dear-od", gpus=8, quota_gpus=8)),
    ):
        assert admin.post(path, body).status_code == 201, body
    creds = {}
    for name, pool in (("cheap", "cheap-rsv"), ("dear", "dear-od")):
        answer = admin.post("clusters", b.cluster(name, pools=[pool]))
        assert answer.status_code == 201, answer.text
        creds[name] = answer.json()["nats_credentials"]
    for name in ("llama", "qwen"):
        body = b.deployment(
            name, gpus_per_replica=8, autoscaling={"min_replicas": 1, "max_replicas": 1}
        )
        assert admin.post("deployments", body).status_code == 201
    return creds


class Planes:
    """NATS with per-cluster users, the control plane's bus process and one agent per
    cluster, each startable and stoppable on its own."""

    def __init__(self, creds: dict[str, dict], database_url: str, tmp: Path) -> None:
        self.creds, self.tmp = creds, tmp
        self.controlplane = generate_controlplane_credentials()
        users = {n: NatsCredentials(user=c["user"], password=c["password"]) for n, c in creds.items()}  # fmt: skip
        port = free_port()
        config = write_server_config(tmp / "nats.conf", render_server_config(
            controlplane=self.controlplane, clusters=users, store_dir=tmp / "js", port=port))  # fmt: skip
        self.server = NatsServer(store_dir=tmp / "js", port=port, config_file=config)
        self.settings = Settings(database_url=database_url, nats_url=f"nats://127.0.0.1:{port}")
        self.agents: dict[str, tuple[asyncio.Event, asyncio.Task, InMemoryRuntime]] = {}
        self.tasks: list[tuple[asyncio.Event, asyncio.Task]] = []

    def start_bus(self) -> None:
        self.server.start()
        stop = asyncio.Event()
        self.tasks.append((stop, asyncio.create_task(run_bus(self.settings, stop, poll_s=0.05))))

    def start_agent(self, cluster: str) -> InMemoryRuntime:
        runtime, stop = InMemoryRuntime(gpus=8), asyncio.Event()
        task = asyncio.create_task(run_agent(
            cluster, self.server.url, NatsCredentials.model_validate(self.creds[cluster]),
            self.tmp / f"agent-{cluster}-{len(self.tasks)}", runtime, heartbeat_interval=0.2,
            reconcile_interval=0.1, stop=stop, fsync=False, gpus=runtime))  # fmt: skip
        self.agents[cluster] = (stop, task, runtime)
        self.tasks.append((stop, task))
        return runtime

    async def stop_agent(self, cluster: str) -> None:
        stop, task, _ = self.agents.pop(cluster)
        stop.set()
        await task

    async def close(self) -> None:
        for stop, _ in self.tasks:
            stop.set()
        tasks = [t for _, t in self.tasks]
        _done, stuck = await asyncio.wait(tasks, timeout=10)  # a failed test must not hang
        for task in stuck:
            task.cancel()
        if stuck:
            _done, stuck = await asyncio.wait(stuck, timeout=10)
        self.server.stop()
        assert not stuck, f"tasks that ignored both stop and cancel: {sorted(map(repr, stuck))}"

    def alive(self, cluster: str) -> None:
        """Raises what ended the cluster's agent, if it ended (a wait for its reports would
        only time out)."""
        _, task, _ = self.agents[cluster]
        if task.done():
            raise AssertionError(f"the agent of {cluster} ended: {task!r}") from (
                None if task.cancelled() else task.exception()
            )


@contextlib.asynccontextmanager
async def planes(fleet, database_url: str, tmp: Path, monkeypatch):
    p = Planes(fleet, database_url, tmp)
    monkeypatch.setenv("GPUFLEET_NATS_USER", p.controlplane.user)
    monkeypatch.setenv("GPUFLEET_NATS_PASSWORD", p.controlplane.password)
    monkeypatch.setattr("controlplane.bus_process.trigger_replan", lambda reason: None)
    try:
        p.start_bus()
        yield p
    finally:
        await p.close()


def placed(factory: sessionmaker[Session]) -> dict[str, str]:
    """Deployment → the cluster the stored placement puts it on."""
    with factory() as s:
        rows = s.execute(
            select(m.Deployment.name, m.Cluster.name)
            .join(m.Placement, m.Placement.deployment_id == m.Deployment.id)
            .join(m.Cluster, m.Placement.cluster_id == m.Cluster.id)
            .where(m.Placement.replicas > 0)
        ).all()
    return dict(rows)  # type: ignore[arg-type]


def replan_now(factory: sessionmaker[Session], reason: str) -> None:
    with factory() as s, s.begin():
        assert replan(s, reason, wait_s=5) is not None


def cluster(factory: sessionmaker[Session], name: str) -> m.Cluster:
    with factory() as s:
        return s.scalars(select(m.Cluster).where(m.Cluster.name == name)).one()


async def ready(runtime: InMemoryRuntime) -> list[str]:
    return sorted(r.deployment for r in await runtime.list_replicas() if r.state == "ready")


def reported(factory: sessionmaker[Session], name: str) -> bool:
    row = cluster(factory, name)
    return row.state == "healthy" and bool(cluster_status(row).capacity)


async def reports(p: Planes, factory: sessionmaker[Session], name: str, within: float) -> None:
    """Wait until the control plane has the cluster healthy with its capacity; on a timeout,
    say what it has of it."""

    def seen() -> bool:
        p.alive(name)
        return reported(factory, name)

    try:
        await eventually(seen, within, f"{name} reports")
    except AssertionError as exc:
        row = cluster(factory, name)
        raise AssertionError(
            f"{exc}; the control plane has {name} {row.state}, last heartbeat "
            f"{row.last_heartbeat_at}, capacity {cluster_status(row).capacity}"
        ) from None


async def test_placement_follows_what_the_planes_have_through_a_plane_death(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    async with planes(fleet, database_url, tmp_path, monkeypatch) as p:
        cheap, dear = p.start_agent("cheap"), p.start_agent("dear")
        for name in ("cheap", "dear"):
            await reports(p, session_factory, name, 15)

        replan_now(session_factory, "test")
        # the inventory says 16 reserved GPUs on cheap; its plane has 8: one deployment each
        where = placed(session_factory)
        assert sorted(where.values()) == ["cheap", "dear"], where
        await eventually(
            lambda: _both_ready(cheap, dear, where), 15, "each deployment ready where placed"
        )

        # the dear plane dies: its deployment has nowhere to start (cheap's 8 GPUs are in use)
        on_dear = next(d for d, c in where.items() if c == "dear")
        await p.stop_agent("dear")
        with session_factory() as s, s.begin():
            s.execute(update(m.Cluster).where(m.Cluster.name == "dear").values(state="down"))
        replan_now(session_factory, "cluster_down")
        assert on_dear not in placed(session_factory), "moved where it cannot start"
        assert await ready(cheap) == [deployment_on(where, "cheap")]

        # the plane comes back healthy: the normal placement puts the deployment back on it
        dear = p.start_agent("dear")
        await reports(p, session_factory, "dear", 30)
        replan_now(session_factory, "cluster_healthy")
        assert placed(session_factory).get(on_dear) == "dear"
        await eventually(lambda: _ready_is(dear, [on_dear]), 15, f"{on_dear} ready on dear")


def deployment_on(where: dict[str, str], cluster_name: str) -> str:
    return next(d for d, c in where.items() if c == cluster_name)


async def _ready_is(runtime: InMemoryRuntime, deployments: list[str]) -> bool:
    return await ready(runtime) == deployments


async def _both_ready(cheap: InMemoryRuntime, dear: InMemoryRuntime, where: dict[str, str]) -> bool:
    return await ready(cheap) == [deployment_on(where, "cheap")] and await ready(dear) == [
        deployment_on(where, "dear")
    ]


async def test_a_replica_that_cannot_start_is_placed_elsewhere_with_an_event_saying_why(
    fleet, admin, session_factory
):
    """No capacity report yet: by the inventory both deployments go to cheap. Then cheap's
    plane says qwen cannot start there (its 16 GPUs are not all free for us): the report
    asks for a re-plan, which moves qwen to dear and puts nothing more on cheap."""
    with session_factory() as s, s.begin():
        s.execute(update(m.Cluster).values(state="healthy"))
    replan_now(session_factory, "test")
    assert placed(session_factory) == {"llama": "cheap", "qwen": "cheap"}

    replans: list[str] = []
    sink = DbSink(session_factory, on_change=replans.append)
    llama = ReplicaStatus(replica_id="llama-1", deployment="llama", revision="1",
                          state="ready", pool="cheap-rsv")  # fmt: skip
    report = FreeCapacity(gpu_type="H100-80G", pool="cheap-rsv", gpus=0, total_gpus=16,
                          waiting_replicas={"qwen": 1})  # fmt: skip
    applied = cluster(session_factory, "cheap").desired_generation  # what the plane runs
    heartbeat = ObservedState(cluster="cheap", source="cluster/cheap", replicas=[llama],
                              free_capacity=[report], observed_generation=applied)  # fmt: skip
    await sink.record_observed("cheap", heartbeat, datetime.now(UTC))
    assert replans == ["capacity"]
    (event,) = admin.get("events", type="CapacityReported").json()["items"]
    assert "1 replica(s) of qwen cannot start (0 of 16 GPUs free)" in event["message"], event

    replan_now(session_factory, "capacity")
    assert placed(session_factory) == {"llama": "cheap", "qwen": "dear"}
    with session_factory() as s:
        generation = s.scalar(select(m.Cluster.desired_generation).where(m.Cluster.name == "cheap"))
    assert generation is not None and generation >= 2  # cheap is told to stop trying qwen
    await sink.record_observed("cheap", heartbeat, datetime.now(UTC))
    assert replans == ["capacity"]  # the same report again is no news


async def test_a_plane_with_fewer_gpus_than_its_pools_settles_at_what_fits_and_stays(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    """What `make up`'s demo once did (the dashboard test caught it): a plane of 8 GPUs on two
    pools the inventory counts as 16 + 8, a deployment wanting three 8-GPU replicas. Its
    waiting replica, reported against the plan that put all three there, was counted again
    against the next plan (3 → 1 → 0 placed); the plane, given nothing, reported its 8 GPUs
    without a pool, which was dropped, so the inventory counted again (0 → 3): a loop that
    started and stopped the replica every ~25 s. Now it settles at what fits, and stays."""
    with session_factory() as s, s.begin():
        cheap = s.scalars(select(m.Cluster).where(m.Cluster.name == "cheap")).one()
        cheap.pools.append(s.scalars(select(m.Pool).where(m.Pool.name == "dear-od")).one())
        s.execute(update(m.Deployment).where(m.Deployment.name == "qwen").values(
            autoscaling={"min_replicas": 3, "max_replicas": 3}))  # fmt: skip
        s.execute(delete(m.Deployment).where(m.Deployment.name == "llama"))
    async with planes(fleet, database_url, tmp_path, monkeypatch) as p:
        runtime = p.start_agent("cheap")
        await eventually(lambda: reported(session_factory, "cheap"), 15, "cheap reports")
        history = []
        for _ in range(12):  # placement looks again after every report, as the bus asks it to
            replan_now(session_factory, "capacity")
            history.append(on_cheap(session_factory))
            await eventually(lambda: caught_up(session_factory), 15, "cheap applies the plan")
        assert history[-6:] == [1] * 6, history  # one 8-GPU replica fits; it stays placed
        assert await ready(runtime) == ["qwen"]


def caught_up(factory: sessionmaker[Session]) -> bool:
    """cheap's plane reported (capacity included) from the plan it was last given."""
    row = cluster(factory, "cheap")
    plans = [cap.plan for cap in cluster_status(row).capacity.values()]
    return bool(plans) and all(
        plan is not None and plan >= (row.desired_epoch, row.desired_generation) for plan in plans
    )


def on_cheap(factory: sessionmaker[Session]) -> int:
    with factory() as s:
        return int(s.scalar(
            select(func.coalesce(func.sum(m.Placement.replicas), 0))
            .join(m.Cluster, m.Placement.cluster_id == m.Cluster.id)
            .where(m.Cluster.name == "cheap")) or 0)  # fmt: skip
