"""A workload plane in the test process: Agent + ProcessRuntime (engine-sim or real vLLM
processes) + the router on a free port. No NATS: desired state is handed to the agent.
``router_process``: the plane's router as a process of its own, following a state dir."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    DesiredState,
    ReplicaQuota,
    RevisionSpec,
)
from controlplane.local.supervisor import stop_recorded_replicas
from workloadplane.agent import Agent, ReplicaChanges
from workloadplane.router.core import Router, RouterConfig
from workloadplane.router.server import serve_router
from workloadplane.runtime.process import ProcessConfig, ProcessRuntime, free_port
from workloadplane.runtime.templates import CommandTemplate, enginesim_template
from workloadplane.state import DesiredStateStore


def make_sim_deployment(name: str = "chat", replicas: int = 2, *, concurrency: float = 64,
                        engine_args: list[str] | None = None, max_: int | None = None) -> DeploymentDesired:  # fmt: skip
    return DeploymentDesired(
        name=name,
        spec=RevisionSpec(
            model_id=name,
            revision="r1",
            engine_args=engine_args or ["--tokens-per-s", "200"],
            gpus_per_replica=1,
        ),
        quota=ReplicaQuota(min=replicas, max=replicas if max_ is None else max_),
        autoscaling=AutoscalingPolicy(target_concurrency=concurrency),
    )


@dataclass
class Plane:
    agent: Agent
    runtime: ProcessRuntime
    router: Router
    url: str
    generation: int = 0

    async def apply(self, *deployments: DeploymentDesired) -> None:
        self.generation += 1
        await self.agent.on_desired(DesiredState(cluster="test", generation=self.generation,
                                                 deployments=list(deployments)))  # fmt: skip

    async def wait_ready(self, deployment: str, count: int, timeout: float = 60) -> list[str]:
        """Ids of ``count`` ready replicas the router can route to (bounded real wait)."""
        async with asyncio.timeout(timeout):
            while True:
                ready = [b.replica_id for b in self.router.backends.values()
                         if b.deployment == deployment and b.routable]  # fmt: skip
                if len(ready) >= count:
                    return ready
                await asyncio.sleep(0.05)

    def pid(self, replica_id: str) -> int:
        pid = self.runtime.pid(replica_id)
        assert pid is not None
        return pid


async def until_healthy(url: str, timeout_s: float) -> None:
    """Bounded wait for a router starting at ``url`` to answer ``/health``."""
    async with httpx.AsyncClient() as client, asyncio.timeout(timeout_s):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_plane(tmp: Path, template: CommandTemplate, *,
                        router_config: RouterConfig | None = None,
                        process_config: ProcessConfig | None = None) -> AsyncIterator[Plane]:  # fmt: skip
    router = Router(router_config or RouterConfig())
    changes = ReplicaChanges(router)
    runtime = ProcessRuntime(
        template,
        tmp / "runtime",
        config=process_config or ProcessConfig(health_interval_s=0.5, backoff_initial_s=0.2),
        watcher=changes,
        in_flight=router,
    )
    store = DesiredStateStore(tmp / "state", fsync=False)
    agent = Agent("test", runtime, store, router=router, changes=changes)
    port = free_port()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(serve_router(router, "127.0.0.1", port, stop)),
             asyncio.create_task(agent.reconcile_loop(0.5))]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    await until_healthy(url, 10)
    try:
        yield Plane(agent, runtime, router, url)
    finally:
        tasks[1].cancel()
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runtime.close()


@pytest.fixture
async def sim_plane(tmp_path: Path) -> AsyncIterator[Plane]:
    async with running_plane(tmp_path, enginesim_template()) as plane:
        yield plane


@pytest.fixture
async def router_process(tmp_path: Path) -> AsyncIterator[tuple[Path, int]]:
    """``gpufleet router --state-dir``: (the agent's state dir to give it, the router's port)."""
    state, port = tmp_path / "agent", free_port()
    state.mkdir()
    argv = [sys.executable, "-m", "workloadplane.router", "--state-dir", str(state),
            "--port", str(port)]  # fmt: skip
    with open(tmp_path / "router.log", "wb") as log:
        proc = subprocess.Popen(argv, start_new_session=True, stdout=log, stderr=log)
    try:
        await until_healthy(f"http://127.0.0.1:{port}", 30)
        yield state, port
    finally:
        proc.terminate()
        proc.wait(10)
        stop_recorded_replicas(state / "runtime", grace_s=2)  # what the test left running


def kill(pid: int, sig: signal.Signals) -> Callable[[], None]:
    """Send ``sig`` to a replica's process group; returns a SIGCONT for SIGSTOP's sake."""
    os.killpg(pid, sig)

    def resume() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)

    return resume
