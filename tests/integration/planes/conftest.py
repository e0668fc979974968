"""Fixtures of the tests that run both planes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
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
from controlplane.settings import Settings
from tests.integration.api import builders as b
from workloadplane.agent import run_agent
from workloadplane.runtime.memory import InMemoryRuntime


@pytest.fixture
def fleet(admin, session_factory) -> dict[str, str]:
    """One provider/region/pool, a cluster (its NATS password is shown once) and a deployment."""
    for path, body in (("providers", b.provider()), ("regions", b.region()), ("gpu-types", b.gpu_type()),
                       ("pools", b.pool())):  # fmt: skip
        assert admin.post(path, body).status_code == 201
    cluster = admin.post("clusters", b.cluster()).json()
    assert (
        admin.post(
            "deployments", b.deployment(autoscaling={"min_replicas": 2, "max_replicas": 4})
        ).status_code
        == 201
    )
    return cluster["nats_credentials"]


@dataclass
class Planes:
    server: NatsServer
    store: Path
    """The NATS server's JetStream store."""
    runtime: InMemoryRuntime


@contextlib.asynccontextmanager
async def bus_and_agent(
    fleet: dict[str, str],
    session_factory: Any,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    **settings: Any,
) -> AsyncIterator[Planes]:
    """The fleet's NATS (per-cluster users, as `gpufleet up` runs it), the control plane's
    bus side (`run_bus`) and the cluster's agent (memory runtime) in this process; all
    stopped on leaving."""
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
    config_ = Settings(database_url=database_url, nats_url=server.url, **settings)
    runtime = InMemoryRuntime()
    creds = NatsCredentials.model_validate(fleet)  # exactly what the API showed once
    tasks = []
    try:
        tasks.append(asyncio.create_task(run_bus(config_, stop_bus, poll_s=0.05)))
        tasks.append(asyncio.create_task(run_agent(
            row.name, server.url, creds, tmp_path / "agent", runtime,
            heartbeat_interval=0.2, reconcile_interval=0.1, stop=stop_agent, fsync=False)))  # fmt: skip
        yield Planes(server, store, runtime)
    finally:
        stop_agent.set()
        stop_bus.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.stop()
