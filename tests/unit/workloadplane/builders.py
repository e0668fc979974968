"""Builders and a Runtime test double for workload-plane unit tests."""

from __future__ import annotations

import itertools

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
)


def make_deployment(name: str = "chat", revision: str = "r1", min_: int = 1,
                    max_: int = 4) -> DeploymentDesired:  # fmt: skip
    return DeploymentDesired(
        name=name,
        spec=RevisionSpec(model_id=f"org/{name}", revision=revision),
        quota=ReplicaQuota(min=min_, max=max_),
    )


def make_desired(generation: int = 1, *deployments: DeploymentDesired,
                 cluster: str = "a") -> DesiredState:  # fmt: skip
    return DesiredState(cluster=cluster, generation=generation, deployments=list(deployments))


def make_replica(replica_id: str, deployment: str = "chat", revision: str = "r1",
                 state: str = "ready") -> ReplicaStatus:  # fmt: skip
    return ReplicaStatus(replica_id=replica_id, deployment=deployment, revision=revision,
                         state=state)  # type: ignore[arg-type]  # fmt: skip


class RecordingRuntime:
    """Runtime double: replicas stay ``starting`` until the test calls ``make_ready``;
    every call is recorded."""

    def __init__(self) -> None:
        self.replicas: dict[str, ReplicaStatus] = {}
        self.calls: list[tuple[str, str]] = []
        self._ids = itertools.count(1)

    async def start(self, deployment: str, spec: RevisionSpec, *, pool: str | None = None,
                    instance: str | None = None, serves: str = "") -> ReplicaStatus:  # fmt: skip
        replica = make_replica(f"{deployment}-{next(self._ids)}", deployment, spec.revision,
                               "starting").model_copy(update={"pool": pool, "instance": instance,
                                                              "serves": serves})  # fmt: skip
        self.replicas[replica.replica_id] = replica
        self.calls.append(("start", replica.replica_id))
        return replica

    async def stop(self, replica_id: str) -> None:
        self.calls.append(("stop", replica_id))
        self.replicas.pop(replica_id, None)

    async def drain(self, replica_id: str) -> None:
        self.calls.append(("drain", replica_id))
        if replica_id in self.replicas:
            self.replicas[replica_id] = self.replicas[replica_id].model_copy(
                update={"state": "draining"}
            )

    async def list_replicas(self) -> list[ReplicaStatus]:
        return list(self.replicas.values())

    async def adopt(self, replica_id: str, deployment: str) -> None:
        self.calls.append(("adopt", replica_id))
        self.replicas[replica_id] = self.replicas[replica_id].model_copy(
            update={"deployment": deployment, "serves": ""}
        )

    def make_ready(self) -> None:
        for rid, r in self.replicas.items():
            if r.state == "starting":
                self.replicas[rid] = r.model_copy(update={"state": "ready"})

    def finish_draining(self) -> None:
        self.replicas = {k: r for k, r in self.replicas.items() if r.state != "draining"}
