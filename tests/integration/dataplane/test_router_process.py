"""The plane's router as a process of its own (``gpufleet router --state-dir``), with an agent
whose runtime runs engine-sim replicas: the agent going away costs nothing in flight, new
requests keep being served, a new agent re-syncs, and what goes from router to agent across
the process boundary (scale-from-zero wake-ups, in-flight counts for drains) still works."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from controlplane.contracts import DeploymentDesired, DesiredState
from tests.integration.dataplane.conftest import make_sim_deployment
from tests.integration.dataplane.test_router_enginesim import chat, until
from workloadplane.agent import Agent, ReplicaChanges
from workloadplane.router.remote import RemoteRouter
from workloadplane.runtime.process import ProcessConfig, ProcessRuntime
from workloadplane.runtime.templates import enginesim_template
from workloadplane.state import DesiredStateStore

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@dataclass
class PlaneAgent:
    agent: Agent
    runtime: ProcessRuntime
    router: RemoteRouter
    tasks: list[asyncio.Task[None]]

    async def crash(self) -> None:
        """Gone the way a killed agent goes: its loops stop, its replicas keep running."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runtime.close(stop_replicas=False)
        self.router.close()


@contextlib.asynccontextmanager
async def plane_agent(state: Path, router_port: int) -> AsyncIterator[PlaneAgent]:
    router = RemoteRouter("127.0.0.1", router_port)
    changes = ReplicaChanges(router)
    runtime = ProcessRuntime(
        enginesim_template(),
        state / "runtime",
        config=ProcessConfig(health_interval_s=0.5, backoff_initial_s=0.2),
        watcher=changes,
        in_flight=router,
    )
    agent = Agent("test", runtime, DesiredStateStore(state, fsync=False), router=router,
                  changes=changes)  # fmt: skip
    tasks = [asyncio.create_task(agent.reconcile_loop(0.5)),
             asyncio.create_task(agent.autoscale_loop(0.5)),
             asyncio.create_task(router.follow())]  # fmt: skip
    plane = PlaneAgent(agent, runtime, router, tasks)
    try:
        yield plane
    finally:
        if not tasks[0].done():
            await plane.crash()


async def apply(plane: PlaneAgent, generation: int, *deployments: DeploymentDesired) -> None:
    await plane.agent.on_desired(DesiredState(cluster="test", generation=generation,
                                              deployments=list(deployments)))  # fmt: skip


async def served(url: str) -> bool:
    async with httpx.AsyncClient(timeout=10) as client:
        with contextlib.suppress(httpx.HTTPError):
            r = await client.post(f"{url}/v1/chat/completions", json=chat())
            return r.status_code == 200
    return False


async def test_the_agent_going_away_costs_nothing_in_flight(router_process):
    # once (CI, 2 loaded cores) this hung until pytest-timeout, whose dump shows threads,
    # not the awaited line: a timeout inside the loop names it
    async with asyncio.timeout(180):
        await _the_agent_going_away(router_process)


async def _the_agent_going_away(router_process: tuple[Path, int]) -> None:
    state, port = router_process
    url = f"http://127.0.0.1:{port}"
    slow = make_sim_deployment(replicas=1, engine_args=["--tokens-per-s", "40"])
    async with plane_agent(state, port) as first:
        await apply(first, 1, slow)
        async with asyncio.timeout(60):
            while not await served(url):
                await asyncio.sleep(0.1)
        pids = {r: first.runtime.pid(r) for r in first.runtime._replicas}
        async with httpx.AsyncClient(timeout=30) as client:
            events: list[str] = []

            async def stream() -> None:
                body = chat(max_tokens=60, stream=True)
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line)

            reader = asyncio.create_task(stream())
            await until(lambda: len(events) >= 3, "the stream to flow")
            await first.crash()  # mid-stream
            codes = [
                (await client.post(f"{url}/v1/chat/completions", json=chat())).status_code
                for _ in range(20)
            ]
            models = (await client.get(f"{url}/v1/models")).json()["data"]
            await reader
    assert events[-1] == "data: [DONE]" and len(events) > 50, events[-3:]
    assert codes == [200] * 20
    assert [m["id"] for m in models] == ["chat"]
    # a new agent adopts the replicas the router kept serving, restarting none
    async with plane_agent(state, port) as second:
        async with asyncio.timeout(10):
            while not await second.runtime.list_replicas():
                await asyncio.sleep(0.05)
        assert {r.replica_id: second.runtime.pid(r.replica_id)
                for r in await second.runtime.list_replicas()} == pids  # fmt: skip
        await until(lambda: second.router.fresh, "the agent to read the router's load again")
        assert await served(url)


async def test_wake_ups_and_drains_cross_the_process_boundary(router_process):
    state, port = router_process
    url = f"http://127.0.0.1:{port}"
    idle = make_sim_deployment(replicas=0, max_=1, engine_args=["--tokens-per-s", "40"])
    idle = idle.model_copy(update={"autoscaling": idle.autoscaling.model_copy(
        update={"scale_to_zero_idle_seconds": 600.0})})  # fmt: skip
    async with plane_agent(state, port) as plane, httpx.AsyncClient(timeout=60) as client:
        await apply(plane, 1, idle)
        async with asyncio.timeout(5):  # the router reads the snapshot within 0.1-0.2 s
            while "chat" not in (await client.get(f"{url}/v1/models")).text:
                await asyncio.sleep(0.05)
        # no replica: the router holds the request and the agent's autoscaler is woken
        first = await client.post(f"{url}/v1/chat/completions", json=chat())
        assert first.status_code == 200
        (rid,) = [r.replica_id for r in await plane.runtime.list_replicas()]
        request = asyncio.create_task(
            client.post(f"{url}/v1/chat/completions", json=chat(max_tokens=40))
        )
        await until(lambda: plane.router.replica_in_flight(rid) == 1, "the router's count")
        await plane.runtime.drain(rid)  # waits (in its task) for the router's count to be 0
        answer = await request
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 40
        await until(lambda: plane.runtime.state(rid) is None, "the drained replica to stop", 15)
