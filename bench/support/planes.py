"""The failover bench's planes: each a real plane router (``gpufleet router --replica …
--cluster NAME``, its own process as in a plane, publishing the plane's load on NATS) over
engine-sim replicas, with a delay proxy in front (the network to its region).

A plane is killed (router and replicas SIGKILLed: the host still answers, with an RST),
hung (SIGSTOP: connections are accepted by the kernel and nothing answers) and brought back
on the same ports. The proxies run in one process of their own
(``bench/support/delay_proxy.py``) and report every request start; :class:`Network` keeps
those times per plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workloadplane.router.upstream import UpstreamError, UpstreamPool
from workloadplane.runtime.process import free_port

MODEL = "chat"
PROXY = Path(__file__).with_name("delay_proxy.py")


@dataclass(frozen=True)
class PlaneSpec:
    name: str
    region: str
    latitude: float
    longitude: float
    jurisdiction: str
    delay_ms: float  # one way, between the fronts and the plane
    replicas: int = 2
    concurrency: int = 64  # per replica, at the router; the engine runs as many at once
    tokens_per_s: float = 50.0


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


async def wait_healthy(port: int, timeout: float = 60.0) -> None:
    pool = UpstreamPool("127.0.0.1", port)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                resp = await pool.request("GET", "/v1/models", head_timeout=1)
                body = await resp.read()
                resp.release()
                if resp.status == 200 and MODEL.encode() in body:
                    return
            except UpstreamError:
                pass
            await asyncio.sleep(0.1)
    finally:
        pool.close()
    raise SystemExit(f"nothing serves {MODEL!r} on port {port} within {timeout:.0f} s")


@dataclass
class Plane:
    spec: PlaneSpec
    nats_url: str = ""  # where the router publishes the plane's load; "": nowhere
    router_port: int = field(default_factory=free_port)
    proxy_port: int = field(default_factory=free_port)
    sim_ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return self.spec.replicas * self.spec.concurrency

    @property
    def endpoint(self) -> str:
        """Where the fronts reach the plane: its delay proxy."""
        return f"http://127.0.0.1:{self.proxy_port}"

    def start(self) -> None:
        """Start (or restart on the same ports) the replicas and the router."""
        if not self.sim_ports:
            self.sim_ports = [free_port() for _ in range(self.spec.replicas)]
        s = self.spec
        self.procs = [
            spawn(
                [
                    sys.executable,
                    "-m",
                    "workloadplane.enginesim",
                    "--port",
                    str(p),
                    "--model",
                    MODEL,
                    "--tokens-per-s",
                    str(s.tokens_per_s),
                    "--max-num-seqs",
                    str(s.concurrency),
                ]
            )
            for p in self.sim_ports
        ]
        replicas = [
            a for p in self.sim_ports for a in ("--replica", f"{MODEL}=http://127.0.0.1:{p}")
        ]
        load = ["--cluster", s.name, "--nats-url", self.nats_url] if self.nats_url else []
        self.procs.append(
            spawn(
                [
                    sys.executable,
                    "-m",
                    "workloadplane.router",
                    "--port",
                    str(self.router_port),
                    *load,
                    "--concurrency",
                    str(s.concurrency),
                    *replicas,
                ]
            )
        )

    async def ready(self) -> None:
        for p in self.sim_ports:
            await wait_healthy(p)
        await wait_healthy(self.router_port)

    def kill(self) -> None:
        """The plane dies: its router and replicas are SIGKILLed."""
        for p in self.procs:
            signal_group(p, signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def hang(self) -> None:
        """The plane hangs: router and replicas SIGSTOPped (the kernel still accepts)."""
        for p in self.procs:
            signal_group(p, signal.SIGSTOP)

    def stop(self) -> None:
        for p in self.procs:
            signal_group(p, signal.SIGCONT)
        self.kill()
        self.procs = []


class Network:
    """The planes' delay proxies, in one process; ``requests[plane]`` holds the
    ``time.monotonic()`` of every request start that went toward that plane,
    ``connections[plane]`` the connections opened to it."""

    def __init__(self, planes: Sequence[Plane]) -> None:
        self.planes = list(planes)
        self.requests: dict[str, list[float]] = {p.spec.name: [] for p in planes}
        self.connections: dict[str, int] = {p.spec.name: 0 for p in planes}
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        routes = [
            a
            for p in self.planes
            for a in ("--route", f"{p.spec.name}={p.proxy_port}:{p.router_port}:{p.spec.delay_ms}")
        ]
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(PROXY),
            *routes,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        async with asyncio.timeout(30):
            line = await self._proc.stdout.readline()
        if line.strip() != b"ready":
            raise SystemExit(f"the delay proxies did not start: {line!r}")
        self._reader = asyncio.create_task(self._read(self._proc.stdout))

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            kind, name, at = line.decode().split()
            if kind == "req":
                self.requests[name].append(float(at))
            else:
                self.connections[name] += 1

    def last_request(self, plane: str, after: float) -> float | None:
        """The last request start toward ``plane`` at or after ``after``, if any."""
        times = [t for t in self.requests[plane] if t >= after]
        return max(times) if times else None

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            await self._proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
