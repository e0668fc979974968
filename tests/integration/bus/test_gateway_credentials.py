"""A gateway's NATS credentials read the routing table and the planes' load, nothing more.

Every refusal comes from a real nats-server (the permissions rendered into its config by
`render_server_config(gateways=…)`); the test talks raw NATS where the client library would
hide what the server said.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from controlplane.bus import (
    ensure_bus,
    ensure_routes_bucket,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    generate_gateway_credentials,
    publish_desired,
    render_server_config,
    write_server_config,
)
from controlplane.bus.routes import RoutesPublisher, current_routes, encode_table
from controlplane.contracts import (
    DESIRED_BUCKET,
    DESIRED_STREAM,
    ROUTES_STREAM,
    ROUTES_SUBJECT,
    NatsCredentials,
    PlaneLoad,
    RoutingTable,
    decode_plane_load,
    decode_routing_table,
    desired_subject,
    encode,
    plane_load_subject,
)
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from tests.integration.bus.builders import make_desired
from tests.integration.bus.conftest import SETUP_S, Bus, eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

WAIT_S = 10.0  # what is allowed must arrive: a bound for a loaded machine, not a pace


class GatewayBus(Bus):
    gateway: NatsCredentials


@pytest.fixture
async def gbus(tmp_path: Path) -> AsyncIterator[GatewayBus]:
    cp = generate_controlplane_credentials()
    clusters = {"a": generate_cluster_credentials("a")}
    gateway = generate_gateway_credentials("edge")
    port, store = free_port(), tmp_path / "jetstream"
    text = render_server_config(
        controlplane=cp, clusters=clusters, gateways={"edge": gateway}, store_dir=store, port=port
    )
    conf = write_server_config(tmp_path / "nats.conf", text)
    server = NatsServer(store_dir=store, port=port, config_file=conf, log_file=tmp_path / "log")
    server.start()
    try:
        holder = GatewayBus(server, cp, clusters, None, None, None)  # type: ignore[arg-type]
        holder.gateway = gateway
        holder.nc = await holder.connect(cp)
        holder.js = holder.nc.jetstream(timeout=1.0)
        await ensure_bus(holder.nc.jetstream(timeout=SETUP_S))
        holder.kv = await holder.js.key_value(DESIRED_BUCKET)
        yield holder
        await holder.nc.close()
    finally:
        server.stop()


def violations(errors: list[Exception]) -> list[str]:
    return [str(e).lower() for e in errors if "permissions violation" in str(e).lower()]


def consumer_request(stream: str, filter_subject: str, deliver: str) -> bytes:
    return json.dumps(
        {
            "stream_name": stream,
            "config": {
                "name": "gw",
                "filter_subject": filter_subject,
                "deliver_subject": deliver,
                "ack_policy": "none",
                "deliver_policy": "last_per_subject",
            },
        }
    ).encode()


async def publish_table(bus: Bus, generation: int) -> RoutingTable:
    table = RoutingTable(generation=generation)
    kv = await ensure_routes_bucket(bus.js)
    assert (await RoutesPublisher(kv).publish(table)).outcome == "published"
    return table


async def test_a_gateway_reads_the_routing_table_and_the_planes_load(gbus: GatewayBus):
    await publish_table(gbus, 3)
    nc = await gbus.connect(gbus.gateway)
    plane = await gbus.connect(gbus.clusters["a"])
    try:
        raw = await nc.jsm(timeout=WAIT_S).get_msg(
            ROUTES_STREAM, subject=ROUTES_SUBJECT, direct=True
        )
        assert raw.data is not None and decode_routing_table(raw.data).generation == 3
        # a watch: a consumer filtered on the one key, delivered to the gateway's inbox
        inbox = nc.new_inbox()
        assert inbox.startswith("_INBOX_GW_edge.")
        sub = await nc.subscribe(inbox)
        resp = await nc.request(
            f"$JS.API.CONSUMER.CREATE.{ROUTES_STREAM}.gw.{ROUTES_SUBJECT}",
            consumer_request(ROUTES_STREAM, ROUTES_SUBJECT, inbox),
            timeout=WAIT_S,
        )
        assert "error" not in json.loads(resp.data)
        assert decode_routing_table((await sub.next_msg(timeout=WAIT_S)).data).generation == 3
        await publish_table(gbus, 4)
        assert decode_routing_table((await sub.next_msg(timeout=WAIT_S)).data).generation == 4
        # every plane's load, on core NATS
        loads = await nc.subscribe("gpufleet.v1.cluster.*.load")
        await nc.flush()
        sent = PlaneLoad(cluster="a", source="cluster/a", sequence=7)
        got = None
        async with asyncio.timeout(WAIT_S):
            while got is None:  # core NATS is at most once: a router reports every 0.5 s
                await plane.publish(plane_load_subject("a"), encode(sent))
                await plane.flush()
                with contextlib.suppress(NatsTimeoutError):
                    got = decode_plane_load((await loads.next_msg(timeout=0.5)).data)
        assert (got.cluster, got.sequence) == ("a", 7)
    finally:
        await nc.close()
        await plane.close()


async def test_a_gateway_cannot_publish_load_write_the_table_or_read_desired_state(
    gbus: GatewayBus,
):
    await publish_table(gbus, 5)
    await publish_desired(gbus.kv, make_desired("a", 2))
    errors: list[Exception] = []
    nc = await gbus.connect(gbus.gateway, errors)
    watcher = await gbus.connect(gbus.controlplane)
    try:
        loads = await watcher.subscribe(plane_load_subject("a"))
        await watcher.flush()
        # 1. a forged plane load, 2. a write of the table (a KV put is a publish on its subject)
        await nc.publish(
            plane_load_subject("a"), encode(PlaneLoad(cluster="a", source="cluster/a"))
        )
        forged = RoutingTable(generation=10**9)
        await nc.publish(ROUTES_SUBJECT, encode_table(forged))
        await nc.flush()
        # 3. a desired-state key: by direct get, by a consumer, by a core subscription
        with pytest.raises(NatsTimeoutError):
            await nc.request(
                f"$JS.API.DIRECT.GET.{DESIRED_STREAM}.{desired_subject('a')}", b"", timeout=0.25
            )
        with pytest.raises(NatsTimeoutError):
            await nc.request(
                f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.gw.{desired_subject('a')}",
                consumer_request(DESIRED_STREAM, desired_subject("a"), nc.new_inbox()),
                timeout=0.25,
            )
        await nc.subscribe(desired_subject("a"))
        await eventually(lambda: len(violations(errors)) == 5, what="five server refusals")
        refused = violations(errors)
        assert refused == [
            f'nats: permissions violation for publish to "{s.lower()}"'
            for s in (
                plane_load_subject("a"),
                ROUTES_SUBJECT,
                f"$JS.API.DIRECT.GET.{DESIRED_STREAM}.{desired_subject('a')}",
                f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}.gw.{desired_subject('a')}",
            )
        ] + [f'nats: permissions violation for subscription to "{desired_subject("a").lower()}"']
        with pytest.raises(NatsTimeoutError):
            await loads.next_msg(timeout=0.2)  # the forged load reached no one
        stored, _ = await current_routes(await ensure_routes_bucket(gbus.js))
        assert stored is not None and stored.generation == 5  # the table is untouched
    finally:
        await nc.close()
        await watcher.close()
