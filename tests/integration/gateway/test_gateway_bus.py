"""The gateway's bus with its own read-only NATS user on a real nats-server (the config `up`
renders): it follows the routing table's key and hears a plane's load, and may publish
nothing else."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import nats
from nats.js.api import KeyValueConfig

from controlplane.bus import (
    generate_cluster_credentials,
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.contracts import (
    ROUTES_BUCKET,
    ROUTES_KEY,
    DeploymentLoad,
    DeploymentRoute,
    NatsCredentials,
    PlaneLoad,
    PlaneRoute,
    RoutingTable,
    encode,
    gateway_inbox_prefix,
    gateway_user,
    plane_load_subject,
)
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from workloadplane.gateway.bus import GatewayBus
from workloadplane.gateway.state import GatewayState, RoutesStore


async def _eventually(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_gateway_follows_the_table_and_loads_with_read_only_credentials(tmp_path: Path):
    cp = generate_controlplane_credentials()
    cluster = generate_cluster_credentials("a")
    gw = NatsCredentials(user=gateway_user("g1"), password=secrets.token_urlsafe(16),
                         inbox_prefix=gateway_inbox_prefix("g1"))  # fmt: skip
    port = free_port()
    text = render_server_config(controlplane=cp, clusters={"a": cluster}, gateways={"g1": gw},
                                store_dir=tmp_path / "js", port=port)  # fmt: skip
    conf = write_server_config(tmp_path / "nats.conf", text)
    server = NatsServer(store_dir=tmp_path / "js", port=port, config_file=conf).start()
    state = GatewayState("r", time.monotonic, RoutesStore(tmp_path / "gw"))
    bus = GatewayBus("g1", server.url, gw, state, resync_interval=0.5)
    try:
        admin = await nats.connect(server.url, **cp.connect_options())
        kv = await admin.jetstream().create_key_value(KeyValueConfig(bucket=ROUTES_BUCKET))
        plane = PlaneRoute(cluster="a", endpoint="http://127.0.0.1:9", region="r",
                           jurisdiction="US", latitude=0, longitude=0)  # fmt: skip
        table = RoutingTable(
            generation=1, deployments=[DeploymentRoute(name="chat", planes=[plane])]
        )
        await kv.put(ROUTES_KEY, table.model_dump_json().encode())
        await bus.start()
        await _eventually(lambda: "chat" in state.routes, 10, "the table")
        agent = await nats.connect(server.url, **cluster.connect_options())
        report = PlaneLoad(
            cluster="a", source="cluster/a", deployments=[DeploymentLoad(name="chat")]
        )
        await _eventually(lambda: state.bus_connected, 5, "the bus")
        for _ in range(50):
            await agent.publish(plane_load_subject("a"), encode(report))
            await agent.flush()
            if state.planes["a"].load is not None:
                break
            await asyncio.sleep(0.05)
        assert state.planes["a"].load is not None
        # read only: a gateway may not write the table
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        sneaky = await nats.connect(server.url, error_cb=on_error, **gw.connect_options())
        await sneaky.publish(f"$KV.{ROUTES_BUCKET}.{ROUTES_KEY}", b"{}")
        await sneaky.flush()
        await _eventually(lambda: bool(errors), 5, "a permissions violation")
        assert "permissions violation" in str(errors[0]).lower()
        for nc in (sneaky, agent, admin):
            await nc.close()
    finally:
        await bus.close()
        state.close()
        server.stop()
