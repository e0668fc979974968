"""What a plane reports of its GPUs: per pool the GPUs it can use, the free ones, and the
replicas that cannot start for lack of them — through the agent's heartbeat, with a runtime
that has 8 GPUs (issue 12 item 6: placement counted 16 where the agent had 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    PoolQuota,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)
from workloadplane.agent import Agent
from workloadplane.capacity import free_capacity
from workloadplane.reconcile import StartReplica
from workloadplane.runtime.memory import InMemoryRuntime
from workloadplane.state import DesiredStateStore

ASYNC = pytest.mark.asyncio(loop_scope="session")


def make_deployment(name: str, gpus: int, replicas: int, pool: str = "reserved-a") -> DeploymentDesired:  # fmt: skip
    return DeploymentDesired(
        name=name,
        spec=RevisionSpec(model_id=name, revision="r1", gpus_per_replica=gpus, gpu_types=["H100"]),
        quota=ReplicaQuota(min=replicas, max=replicas),
        pools=[pool],
        pool_quotas=[PoolQuota(pool=pool, min=replicas, max=replicas)],
    )


def make_desired(*deployments: DeploymentDesired) -> DesiredState:
    return DesiredState(cluster="a", generation=1, deployments=list(deployments))


async def plane(tmp_path: Path, *deployments: DeploymentDesired) -> tuple[Agent, InMemoryRuntime]:
    runtime = InMemoryRuntime(gpus=8)
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), gpus=runtime)
    await agent.on_desired(make_desired(*deployments))
    await agent.reconcile_once()
    return agent, runtime


@ASYNC
async def test_a_full_plane_reports_its_8_gpus_and_the_replica_that_cannot_start(tmp_path: Path):
    agent, runtime = await plane(
        tmp_path, make_deployment("llama", 8, 1), make_deployment("qwen", 8, 1)
    )
    replicas = await runtime.list_replicas()
    assert [r.deployment for r in replicas] == ["llama"]  # qwen's start failed: no GPU left
    (report,) = (await agent.observed_state()).free_capacity
    assert report.pool == "reserved-a" and report.gpu_type == "H100"
    assert (report.total_gpus, report.gpus) == (8, 0)
    assert report.waiting_replicas == {"qwen": 1}


@ASYNC
async def test_a_plane_with_room_reports_no_waiting_replica(tmp_path: Path):
    agent, _ = await plane(tmp_path, make_deployment("llama", 2, 2))
    (report,) = (await agent.observed_state()).free_capacity
    assert (report.total_gpus, report.gpus, report.waiting_replicas) == (8, 4, {})


@ASYNC
async def test_without_a_gpu_inventory_nothing_is_reported(tmp_path: Path):
    agent = Agent("a", InMemoryRuntime(), DesiredStateStore(tmp_path, fsync=False))
    await agent.on_desired(make_desired(make_deployment("llama", 8, 1)))
    await agent.reconcile_once()
    assert (await agent.observed_state()).free_capacity == []


def test_pools_sharing_the_runtime_each_count_their_replicas_plus_the_free_gpus():
    a, b = make_deployment("llama", 4, 1, "pool-a"), make_deployment("qwen", 2, 1, "pool-b")
    desired = make_desired(a, b)
    running = [
        r.model_copy(update={"state": "ready"})
        for r in (
            _replica("llama-1", "llama", "pool-a"),
            _replica("qwen-1", "qwen", "pool-b"),
        )
    ]
    extra = StartReplica("qwen", b.spec, "pool-b")
    reports = {r.pool: r for r in free_capacity(desired, running, [extra, extra], 8, 2)}
    assert reports["pool-a"].total_gpus == 6  # 4 in use + 2 free: never more than there is
    assert reports["pool-b"].total_gpus == 4
    assert reports["pool-b"].waiting_replicas == {"qwen": 1}  # the second start does not fit


def _replica(replica_id: str, deployment: str, pool: str) -> ReplicaStatus:
    return ReplicaStatus(
        replica_id=replica_id, deployment=deployment, revision="r1", state="starting", pool=pool
    )
