"""Small builders for bus scenarios."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    NatsCredentials,
    ReplicaQuota,
    RevisionSpec,
)
from workloadplane.agent import Agent, serve
from workloadplane.runtime.memory import InMemoryRuntime
from workloadplane.state import DesiredStateStore


def make_desired(
    cluster: str, generation: int, replicas: int = 1, revision: str = "r1", name: str = "chat"
) -> DesiredState:
    return DesiredState(
        cluster=cluster,
        generation=generation,
        deployments=[
            DeploymentDesired(
                name=name,
                spec=RevisionSpec(model_id="meta-llama/Llama-3.1-8B", revision=revision),
                quota=ReplicaQuota(min=replicas, max=replicas + 2),
            )
        ],
    )


@dataclass
class RunningAgent:
    agent: Agent
    runtime: InMemoryRuntime
    task: asyncio.Task[None]
    stop: asyncio.Event

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)


def start_agent(
    cluster: str,
    url: str,
    creds: NatsCredentials | None,
    state_dir: Path,
    runtime: InMemoryRuntime | None = None,
    heartbeat_interval: float = 0.05,
) -> RunningAgent:
    runtime = runtime or InMemoryRuntime()
    agent = Agent(cluster, runtime, DesiredStateStore(state_dir, fsync=False))
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(
            agent,
            url,
            creds,
            heartbeat_interval=heartbeat_interval,
            reconcile_interval=0.05,
            resync_interval=0.5,
            stop=stop,
        )
    )
    return RunningAgent(agent, runtime, task, stop)
