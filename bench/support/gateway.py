"""The gateway under test, as a fleet runs it: its own NATS (JetStream), the routing table
published there by the bench (the control plane's publisher is not part of this bench; the
table is what it would publish: each plane's endpoint is its delay proxy, so the gateway
measures the network itself), plane load from the planes' routers, and ``gpufleet gateway``
in a process of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import nats
from nats.js.api import KeyValueConfig, StorageType

from bench.support.planes import MODEL, Plane, wait_healthy
from controlplane.contracts import (
    MAX_ROUTES_BYTES,
    ROUTES_BUCKET,
    ROUTES_KEY,
    DeploymentRoute,
    PlaneRoute,
    RegionPoint,
    RoutingTable,
)
from controlplane.local.nats import NatsServer, start_nats
from workloadplane.runtime.process import free_port

GPUFLEET = [sys.executable, "-c", "from gpufleet_cli import app; app()"]


def routing_table(planes: Sequence[Plane], client: RegionPoint, generation: int) -> RoutingTable:
    """One deployment (``chat``) served active-active by every plane, at its delay proxy."""
    routes = [
        PlaneRoute(
            cluster=p.spec.name,
            endpoint=p.endpoint,
            region=p.spec.region,
            provider="local",
            jurisdiction=p.spec.jurisdiction,
            latitude=p.spec.latitude,
            longitude=p.spec.longitude,
            replicas=p.spec.replicas,
        )
        for p in planes
    ]
    regions = {client.name: client}
    for p in planes:
        regions.setdefault(
            p.spec.region,
            RegionPoint(
                name=p.spec.region,
                latitude=p.spec.latitude,
                longitude=p.spec.longitude,
                jurisdiction=p.spec.jurisdiction,
            ),
        )
    return RoutingTable(
        generation=generation,
        deployments=[DeploymentRoute(name=MODEL, planes=routes)],
        regions=list(regions.values()),
    )


async def publish_table(nats_url: str, table: RoutingTable) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(
            config=KeyValueConfig(
                bucket=ROUTES_BUCKET,
                history=1,
                storage=StorageType.FILE,
                max_value_size=MAX_ROUTES_BYTES,
            )
        )
        await kv.put(ROUTES_KEY, table.model_dump_json().encode())
    finally:
        await nc.close()


def gateway_available() -> str | None:
    """None when ``gpufleet gateway`` exists here, else why not."""
    done = subprocess.run(
        [*GPUFLEET, "gateway", "--help"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return (
            f"`gpufleet gateway` is not available ({(done.stderr or done.stdout).strip()[-120:]})"
        )
    return None


class Bus:
    """The bench's NATS server."""

    def __init__(self, workdir: Path) -> None:
        self.server: NatsServer = start_nats(workdir / "nats")

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()


class Gateway:
    """One ``gpufleet gateway`` process in ``region``, on a free port."""

    def __init__(self, workdir: Path, nats_url: str, name: str, region: str) -> None:
        self.port = free_port()
        self.workdir, self.nats_url, self.name, self.region = workdir, nats_url, name, region
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            *GPUFLEET,
            "gateway",
            "--name",
            self.name,
            "--region",
            self.region,
            "--port",
            str(self.port),
            "--nats-url",
            self.nats_url,
            "--state-dir",
            str(self.workdir / f"gateway-{self.name}"),
        ]

    async def start(self) -> Gateway:
        env = {**os.environ, "GPUFLEET_LOG_LEVEL": "WARNING"}
        self.proc = subprocess.Popen(
            self.argv(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        await wait_healthy(self.port)  # /v1/models lists the routing table's deployments
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
