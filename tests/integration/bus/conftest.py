"""A real nats-server with JetStream and per-cluster authorization, per test.

Each test gets its own server (it starts in ~50 ms), so tests that restart NATS or pollute
streams stay independent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from controlplane.bus import (
    InMemorySink,
    ReportConsumer,
    ensure_bus,
    generate_cluster_credentials,
    generate_controlplane_credentials,
    render_server_config,
    write_server_config,
)
from controlplane.contracts import DESIRED_BUCKET, NatsCredentials
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port

CLUSTERS = ("a", "b")
SETUP_S = 15.0


@dataclass
class Bus:
    server: NatsServer
    controlplane: NatsCredentials
    clusters: dict[str, NatsCredentials]
    nc: Client
    js: JetStreamContext
    kv: KeyValue
    errors: list[Exception] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    async def connect(
        self, creds: NatsCredentials, errors: list[Exception] | None = None
    ) -> Client:
        async def on_error(exc: Exception) -> None:
            if errors is not None:
                errors.append(exc)

        return await nats.connect(
            self.url,
            error_cb=on_error,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.1,
            **creds.connect_options(),
        )


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0, what: str = "condition"
) -> None:
    """Poll a condition of a real asynchronous event, bounded."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[Bus]:
    cp = generate_controlplane_credentials()
    clusters = {name: generate_cluster_credentials(name) for name in CLUSTERS}
    port = free_port()
    store = tmp_path / "jetstream"
    conf = write_server_config(
        tmp_path / "nats.conf",
        render_server_config(controlplane=cp, clusters=clusters, store_dir=store, port=port),
    )
    server = NatsServer(
        store_dir=store, port=port, config_file=conf, log_file=tmp_path / "nats.log"
    ).start()
    errors: list[Exception] = []
    try:
        holder = Bus(server, cp, clusters, None, None, None, errors)  # type: ignore[arg-type]
        nc = await holder.connect(cp, errors)
        js = nc.jetstream(timeout=1.0)
        # creating the streams may take a loaded machine over a second (CI once): a bound
        # for set-up, not the pace the tests' own requests are held to
        await ensure_bus(nc.jetstream(timeout=SETUP_S))
        kv = await js.key_value(DESIRED_BUCKET)  # the tests' bucket: their 1 s bound
        holder.nc, holder.js, holder.kv = nc, js, kv
        yield holder
        await nc.close()
    finally:
        server.stop()


@pytest.fixture
async def consumer(bus: Bus) -> AsyncIterator[tuple[ReportConsumer, InMemorySink]]:
    sink = InMemorySink()
    c = ReportConsumer(bus.js, sink)
    await c.start()
    yield c, sink
    await c.stop()
