"""A small real fleet for the gateway suite: NATS (JetStream), three planes — each a real
engine-sim replica behind a real plane router process that publishes its load — in
us-east, us-west and eu-central (DE), and two real gateway processes (us-east, eu-central).
The routing table is put into the KV bucket by the test, as the control plane would.

One fleet per module (starting it costs a few seconds); a test that kills or stops a
process brings it back (``Fleet.restart``) before it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.api import KeyValueConfig

from controlplane.contracts import (
    ROUTES_BUCKET,
    ROUTES_KEY,
    DeploymentRoute,
    PlaneRoute,
    RegionPoint,
    RoutingTable,
)
from controlplane.local.nats import NatsServer
from controlplane.local.ports import free_port
from tests.integration.gateway.netns import PlaneNetwork, Relay

REGIONS = {
    "us-east": RegionPoint(name="us-east", latitude=39.0, longitude=-77.5, jurisdiction="US"),
    "us-west": RegionPoint(name="us-west", latitude=45.6, longitude=-121.2, jurisdiction="US"),
    "eu-central": RegionPoint(name="eu-central", latitude=50.1, longitude=8.7, jurisdiction="DE"),
}
PLANES = {"a": "us-east", "b": "us-west", "de": "eu-central"}
GATEWAYS = {"g1": "us-east", "g2": "eu-central"}
TOKENS_PER_S = "40"


def wait_until(check: Callable[[], bool], timeout: float, what: str, every: float = 0.02) -> float:
    """Poll a real asynchronous event, bounded; returns when it held (monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nats = NatsServer(store_dir=tmp / "js", port=free_port(), log_file=tmp / "nats.log")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, list[str]] = {}
        self.ports: dict[str, int] = {}
        self.generation = 0

    # --- processes ------------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str]) -> None:
        self.argv[name] = argv
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "GPUFLEET_LOG_LEVEL": "WARNING"}
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        log.close()

    def restart(self, name: str) -> None:
        self.kill(name)
        self.spawn(name, self.argv[name])
        self.wait_http(self.ports[name])

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, sig)
            proc.wait(10)

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)

    def wait_http(self, port: int, timeout: float = 120, host: str = "127.0.0.1") -> None:
        wait_until(
            lambda: httpx.get(f"http://{host}:{port}/health", timeout=1).status_code == 200,
            timeout,
            f"{host}:{port} to answer",
            every=0.05,
        )

    def start(self) -> None:
        self.nats.start()
        asyncio.run(self._make_bucket())
        py = sys.executable
        for cluster in PLANES:
            sim, router = free_port(), free_port()
            self.ports[f"sim-{cluster}"], self.ports[f"router-{cluster}"] = sim, router
            self.spawn(f"sim-{cluster}", self.sim_argv(cluster))
        for cluster in PLANES:
            self.spawn(f"router-{cluster}", self.router_argv(cluster))
        for name, region in GATEWAYS.items():
            port = self.ports[name] = free_port()
            self.spawn(name, [py, "-m", "gpufleet_cli", "gateway", "--name", name, "--region",
                              region, "--port", str(port), "--state-dir", str(self.tmp / name),
                              "--nats-url", self.nats.url, "--zones-only"])  # fmt: skip
        for name in self.procs:
            self.wait_http(self.ports[name])
        self.put_table()
        for g in GATEWAYS:
            self.wait_ranked(g, "chat", set(PLANES))
            self.wait_warm(g, "chat")

    def sim_argv(self, cluster: str) -> list[str]:
        return [sys.executable, "-m", "workloadplane.enginesim", "--model", "chat",
                "--port", str(self.ports[f"sim-{cluster}"]), "--tokens-per-s", TOKENS_PER_S]  # fmt: skip

    def router_argv(
        self, cluster: str, *, report: bool = True, host: str = "127.0.0.1", nats_url: str = ""
    ) -> list[str]:
        sim = self.ports[f"sim-{cluster}"]
        argv = [sys.executable, "-m", "workloadplane.router", "--host", host, "--port",
                str(self.ports[f"router-{cluster}"]), "--replica", f"chat=http://127.0.0.1:{sim}",
                "--concurrency", "64", "--nats-url", nats_url or self.nats.url]  # fmt: skip
        return [*argv, "--cluster", cluster] if report else argv

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        self.nats.stop()

    # --- NATS -----------------------------------------------------------------------------
    async def _make_bucket(self) -> None:
        nc = await nats.connect(self.nats.url)
        js = nc.jetstream()
        await js.create_key_value(KeyValueConfig(bucket=ROUTES_BUCKET, history=1))
        await nc.close()

    def table(self, **extra_routes: list[str]) -> RoutingTable:
        def plane(cluster: str, role: str = "active") -> PlaneRoute:
            r = REGIONS[PLANES[cluster]]
            return PlaneRoute(cluster=cluster, region=r.name, jurisdiction=r.jurisdiction,
                              endpoint=f"http://127.0.0.1:{self.ports[f'router-{cluster}']}",
                              latitude=r.latitude, longitude=r.longitude, replicas=1,
                              role=role)  # type: ignore[arg-type]  # fmt: skip

        routes = [DeploymentRoute(name="chat", planes=[plane(c) for c in PLANES])]
        for name, clusters in extra_routes.items():
            routes.append(DeploymentRoute(name=name, planes=[plane(c) for c in clusters]))
        self.generation += 1
        return RoutingTable(generation=self.generation, deployments=routes,
                            regions=list(REGIONS.values()))  # fmt: skip

    def put_table(self, table: RoutingTable | None = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else (table or self.table()).model_dump_json().encode()

        async def put() -> None:
            nc = await nats.connect(self.nats.url)
            kv = await nc.jetstream().key_value(ROUTES_BUCKET)
            await kv.put(ROUTES_KEY, data)
            await nc.close()

        asyncio.run(put())

    def publish(self, subject: str, data: bytes) -> None:
        async def pub() -> None:
            nc = await nats.connect(self.nats.url)
            await nc.publish(subject, data)
            await nc.flush()
            await nc.close()

        asyncio.run(pub())

    # --- the gateways ---------------------------------------------------------------------
    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def routes(self, gateway: str, model: str, **params: str) -> dict:
        answer = httpx.get(f"{self.url(gateway)}/debug/routes", params={"model": model, **params},
                           timeout=5)  # fmt: skip
        answer.raise_for_status()
        return answer.json()

    def ranked(self, gateway: str, model: str) -> list[str]:
        return [r["plane"] for r in self.routes(gateway, model)["ranking"]]

    def wait_ranked(self, gateway: str, model: str, planes: set[str], timeout: float = 20) -> None:
        wait_until(lambda: set(self.ranked(gateway, model)) == planes, timeout,
                   f"{gateway} to rank {sorted(planes)} for {model}")  # fmt: skip

    def wait_warm(self, gateway: str, model: str, timeout: float = 20) -> None:
        """Every plane has reported ready replicas (no cold penalty): the tests' first
        choices are then the model's, not a plane whose first load report is still due."""
        wait_until(
            lambda: all(r["cold_ms"] == 0 for r in self.routes(gateway, model)["ranking"]),
            timeout,
            f"{gateway} to hear every plane's ready replicas",
        )

    def metrics(self, gateway: str) -> str:
        return httpx.get(f"{self.url(gateway)}/metrics", timeout=5).text


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("gwfleet"))
    try:
        f.start()
        yield f
    finally:
        f.close()


@pytest.fixture
def cut_plane(fleet: Fleet) -> Iterator[PlaneNetwork]:
    """Plane ``n`` in ``a``'s place (us-east: g1's first choice), its engine-sim and router
    in a network namespace of their own whose links the test can cut: the gateways reach
    its router over the ``data`` link, it publishes its load to NATS over ``bus``."""
    # fails, never skips: the suite runs as root (it installs Debian packages too)
    assert os.geteuid() == 0, "cutting a plane's network needs root (ip netns, tc): run as root"
    net, relay = PlaneNetwork(), None
    try:
        net.open()
        data, bus = net.links["data"], net.links["bus"]
        relay = Relay(bus.root_ip, ("127.0.0.1", fleet.nats.port))
        fleet.ports["sim-n"], fleet.ports["router-n"] = 8000, 8080  # the namespace's own
        fleet.spawn("sim-n", net.argv(fleet.sim_argv("n")))
        router = fleet.router_argv(
            "n", host=data.ns_ip, nats_url=f"nats://{bus.root_ip}:{relay.port}"
        )
        fleet.spawn("router-n", net.argv(router))
        fleet.wait_http(8080, host=data.ns_ip)
        table = fleet.table()
        a, *others = table.deployments[0].planes
        n = a.model_copy(update={"cluster": "n", "endpoint": f"http://{data.ns_ip}:8080"})
        route = table.deployments[0].model_copy(update={"planes": [n, *others]})
        fleet.put_table(table.model_copy(update={"deployments": [route]}))
        fleet.wait_ranked("g1", "chat", {"n", "b", "de"})
        fleet.wait_warm("g1", "chat")
        yield net
    finally:
        try:
            for name in ("router-n", "sim-n"):
                if name in fleet.procs:
                    fleet.kill(name)
            if relay is not None:
                relay.close()
        finally:
            net.close()  # the links go even if a process inside would not
            fleet.put_table(fleet.table())
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})
    fleet.wait_warm("g1", "chat")


def chat(max_tokens: int = 2, **extra: object) -> dict:
    return {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, **extra}  # fmt: skip
