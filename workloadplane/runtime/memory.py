"""A runtime that only keeps replicas in memory (development, bus tests, benchmarks).

Replicas become ``ready`` the first time they are listed after ``start``; ``drain`` and
``stop`` remove them at once. It runs no model: use it where only control flow matters.
"""

from __future__ import annotations

import itertools

from controlplane.contracts import ReplicaStatus, RevisionSpec
from workloadplane.runtime.gpus import InsufficientGpusError


class InMemoryRuntime:
    def __init__(self, ready_on_list: bool = True, *, gpus: int | None = None) -> None:
        """``gpus``: how many GPUs its replicas may use (``start`` raises
        ``InsufficientGpusError`` beyond them, as ProcessRuntime does); None: unlimited."""
        self._gpus = gpus
        self._used: dict[str, int] = {}
        self._replicas: dict[str, ReplicaStatus] = {}
        self._ids = itertools.count(1)
        self._ready_on_list = ready_on_list
        self.started = 0
        self.stopped = 0
        self.drained = 0

    async def start(
        self,
        deployment: str,
        spec: RevisionSpec,
        *,
        pool: str | None = None,
        instance: str | None = None,
        serves: str = "",
    ) -> ReplicaStatus:
        if self._gpus is not None and spec.gpus_per_replica > self.gpu_capacity()[1]:
            raise InsufficientGpusError(
                f"a replica needs {spec.gpus_per_replica} GPUs but "
                f"{self.gpu_capacity()[1]} of {self._gpus} are free"
            )
        replica_id = f"{deployment}-{spec.revision}-{next(self._ids)}"
        self._used[replica_id] = spec.gpus_per_replica
        replica = ReplicaStatus(
            replica_id=replica_id,
            deployment=deployment,
            revision=spec.revision,
            state="starting",
            pool=pool,
            instance=instance,
            serves=serves,
        )
        self._replicas[replica_id] = replica
        self.started += 1
        return replica

    async def adopt(self, replica_id: str, deployment: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is not None:
            self._replicas[replica_id] = replica.model_copy(
                update={"deployment": deployment, "serves": ""}
            )

    async def stop(self, replica_id: str) -> None:
        self._used.pop(replica_id, None)
        if self._replicas.pop(replica_id, None) is not None:
            self.stopped += 1

    async def drain(self, replica_id: str) -> None:
        self._used.pop(replica_id, None)
        if self._replicas.pop(replica_id, None) is not None:
            self.drained += 1

    def gpu_capacity(self) -> tuple[int, int]:
        """``GpuInventory``: (total, free); unlimited GPUs count as what is used."""
        used = sum(self._used.values())
        total = self._gpus if self._gpus is not None else used
        return total, max(0, total - used)

    async def list_replicas(self) -> list[ReplicaStatus]:
        if self._ready_on_list:
            for replica_id, replica in list(self._replicas.items()):
                if replica.state == "starting":
                    self._replicas[replica_id] = replica.model_copy(
                        update={"state": "ready", "endpoint": f"memory://{replica_id}"}
                    )
        return list(self._replicas.values())

    async def close(self, *, stop_replicas: bool = True) -> None:
        """Nothing is held (``ClosableRuntime``): the replicas vanish with the process."""

    def set_state(self, replica_id: str, state: str) -> None:
        """Test hook: force a replica into a state (e.g. ``failed``)."""
        self._replicas[replica_id] = self._replicas[replica_id].model_copy(update={"state": state})
