"""The routing table through the real bus process (`run_bus`, its composition root) on real
PostgreSQL and NATS, read the way a gateway reads it — with its own read-only credentials
(issue 15): a change of placement or of a cluster's endpoint is in the bucket within about a
second, at a new generation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest
from sqlalchemy import update

from controlplane.bus import (
    generate_controlplane_credentials,
    generate_gateway_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.bus_process import run_bus
from controlplane.contracts import (
    ROUTES_STREAM,
    ROUTES_SUBJECT,
    RoutingTable,
    decode_routing_table,
)
from controlplane.db import models as m
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from controlplane.services.placement import replan
from controlplane.settings import Settings
from tests.integration.api import builders as b
from tests.integration.bus.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

PUBLISHED_WITHIN_S = 2.0
"""Bound on change → table in the bucket (the loop polls every 0.25 s; ~0.3 s typical)."""
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
def fleet(admin):
    for path, body in (("providers", b.provider()), ("regions", b.region()),
                       ("gpu-types", b.gpu_type()), ("pools", b.pool()),
                       ("clusters", b.cluster(endpoint="http://127.0.0.1:8200"))):  # fmt: skip
        assert admin.post(path, body).status_code == 201, path
    assert admin.post("deployments", b.deployment()).status_code == 201
    return admin


async def test_changes_reach_the_gateways_table_within_a_second(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    controlplane, gateway = generate_controlplane_credentials(), generate_gateway_credentials("gw")
    port = free_port()
    config = write_server_config(tmp_path / "nats.conf", render_server_config(
        controlplane=controlplane, clusters={}, gateways={"gw": gateway},
        store_dir=tmp_path / "js", port=port))  # fmt: skip
    server = NatsServer(store_dir=tmp_path / "js", port=port, config_file=config).start()
    monkeypatch.setenv("GPUFLEET_NATS_USER", controlplane.user)
    monkeypatch.setenv("GPUFLEET_NATS_PASSWORD", controlplane.password)
    monkeypatch.setattr("controlplane.bus_process.trigger_replan", lambda reason: None)
    stop = asyncio.Event()
    bus = asyncio.create_task(
        run_bus(Settings(database_url=database_url, nats_url=server.url), stop)
    )
    reader = await nats.connect(server.url, **gateway.connect_options())  # type: ignore[arg-type]

    async def table() -> RoutingTable | None:
        try:
            raw = await reader.jsm(timeout=1).get_msg(
                ROUTES_STREAM, subject=ROUTES_SUBJECT, direct=True
            )
        except Exception:  # not there yet
            return None
        return decode_routing_table(raw.data) if raw.data else None

    async def planes_at(generation_above: int) -> list[tuple[str, str, int]] | None:
        t = await table()
        if t is None or t.generation <= generation_above:
            return None
        return [(p.cluster, p.endpoint, p.replicas) for d in t.deployments for p in d.planes]

    try:
        await eventually(lambda: _is(table()), 15, "the first routing table")
        first = await table()
        assert first is not None and [d.planes for d in first.deployments] == [[]]

        with session_factory() as s, s.begin():  # the cluster is heard from, then placed on
            s.execute(update(m.Cluster).values(state="healthy"))
            assert replan(s, "test") is not None
        started = time.monotonic()
        await eventually(lambda: _is(planes_at(first.generation)), 15, "the placement")
        placement_s = time.monotonic() - started
        placed = await table()
        assert placed is not None
        assert await planes_at(first.generation) == [("use1-a", "http://127.0.0.1:8200", 1)]

        started = time.monotonic()
        patch = {"endpoint": "http://127.0.0.1:8300"}
        assert fleet.patch("clusters/use1-a", patch, **MERGE).status_code == 200
        await eventually(lambda: _is(planes_at(placed.generation)), 15, "the new endpoint")
        endpoint_s = time.monotonic() - started
        assert await planes_at(placed.generation) == [("use1-a", "http://127.0.0.1:8300", 1)]
        print(
            f"change → gateway's table: placement {placement_s:.2f} s, endpoint {endpoint_s:.2f} s"
        )
        assert placement_s <= PUBLISHED_WITHIN_S and endpoint_s <= PUBLISHED_WITHIN_S
    finally:
        await reader.close()
        stop.set()
        await asyncio.gather(bus, return_exceptions=True)
        server.stop()


async def _is(awaitable) -> bool:
    """For `eventually`: the awaited value is there."""
    return await awaitable is not None
