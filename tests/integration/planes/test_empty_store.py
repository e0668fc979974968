"""The NATS server comes back on an empty store (a new node, a lost volume): the bus process
found every publication and its consumer failing until it was restarted by hand — no desired
state reached a plane and no heartbeat was recorded. It now makes the streams and its
consumer again and publishes everything again; the agent, which kept serving, picks up."""

from __future__ import annotations

import asyncio
import shutil
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from controlplane.bus import (
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.bus_process import run_bus
from controlplane.contracts import NatsCredentials
from controlplane.db import models as m
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from controlplane.services.placement import replan
from controlplane.settings import Settings
from tests.integration.bus.conftest import eventually
from tests.integration.planes.test_control_loop import _cluster
from workloadplane.agent import run_agent
from workloadplane.runtime.memory import InMemoryRuntime


async def test_the_bus_makes_its_streams_again_when_nats_comes_back_empty(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    controlplane = generate_controlplane_credentials()
    with session_factory() as s:
        row = s.scalars(select(m.Cluster)).one()
        users = {row.name: NatsCredentials(user=row.nats_user, password=row.nats_password_hash)}
    port, store = free_port(), tmp_path / "js"
    config = write_server_config(tmp_path / "nats.conf", render_server_config(
        controlplane=controlplane, clusters=users, store_dir=store, port=port))  # fmt: skip
    server = NatsServer(store_dir=store, port=port, config_file=config).start()
    monkeypatch.setenv("GPUFLEET_NATS_USER", controlplane.user)
    monkeypatch.setenv("GPUFLEET_NATS_PASSWORD", controlplane.password)
    monkeypatch.setattr("controlplane.bus_process.trigger_replan", lambda reason: None)
    stop_bus, stop_agent = asyncio.Event(), asyncio.Event()
    settings = Settings(database_url=database_url, nats_url=server.url, bus_progress_every_s=0.2)
    runtime = InMemoryRuntime()
    tasks = []
    try:
        tasks.append(asyncio.create_task(run_bus(settings, stop_bus, poll_s=0.05)))
        tasks.append(asyncio.create_task(run_agent(
            "use1-a", server.url, NatsCredentials.model_validate(fleet), tmp_path / "agent",
            runtime, heartbeat_interval=0.2, reconcile_interval=0.1, stop=stop_agent,
            fsync=False)))  # fmt: skip
        await eventually(lambda: _cluster(session_factory).state == "healthy", 15, "a heartbeat")
        with session_factory() as s, s.begin():
            assert replan(s, "test") is not None
        first = _cluster(session_factory).desired_generation
        await eventually(lambda: _cluster(session_factory).observed_generation >= first, 15,
                         "the agent to apply the placement")  # fmt: skip

        server.stop()
        shutil.rmtree(store)  # every stream, bucket and consumer gone
        server.start()
        restarted = datetime.now(UTC)

        # heartbeats are recorded again (the reports stream and its consumer made again)
        await eventually(lambda: (_cluster(session_factory).last_heartbeat_at or restarted)
                         > restarted, 30, "a heartbeat recorded after the restart")  # fmt: skip
        # and a new placement reaches the agent (the desired-state bucket made again)
        with session_factory() as s, s.begin():
            s.get(m.Cluster, row.id).desired_generation += 1  # type: ignore[union-attr]
        second = _cluster(session_factory).desired_generation
        await eventually(lambda: _cluster(session_factory).observed_generation >= second, 30,
                         "the agent to apply a generation published after the restart")  # fmt: skip
    finally:
        stop_agent.set()
        stop_bus.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.stop()
