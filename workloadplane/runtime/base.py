"""The Runtime protocol: the only way the agent touches replicas."""

from __future__ import annotations

from typing import Protocol

from controlplane.contracts import ReplicaStatus, RevisionSpec


class Runtime(Protocol):
    """Runs replicas of deployment revisions on this cluster.

    Rules every implementation keeps:
    - ``start`` returns quickly with the new replica in state ``starting``; it becomes
      ``ready`` (or ``failed``) later, as ``list_replicas`` shows.
    - ``stop`` kills a replica now; ``drain`` stops sending it new requests, lets in-flight
      ones finish, then stops it. Both are silent if the replica is already gone.
    - ``start`` records the ``pool`` and ``instance`` it was given in the replica's status
      (reconcile uses them to move replicas off a draining instance or an unused pool).
    - ``list_replicas`` returns every replica the runtime runs, including ones started by a
      previous agent process (the agent adopts them: restarting the agent must not restart
      replicas). A stopped replica disappears from the list.
    """

    async def start(
        self,
        deployment: str,
        spec: RevisionSpec,
        *,
        pool: str | None = None,
        instance: str | None = None,
        serves: str = "",
    ) -> ReplicaStatus: ...

    async def stop(self, replica_id: str) -> None: ...

    async def drain(self, replica_id: str) -> None: ...

    async def list_replicas(self) -> list[ReplicaStatus]: ...

    async def adopt(self, replica_id: str, deployment: str) -> None:
        """The replica now belongs to ``deployment`` (a promoted rollout lane's replica
        joins the deployment it served: same revision, same served name, no restart)."""
        ...


# --- optional capabilities: what a runtime may be given or offer, passed explicitly ----------


class ReplicaWatcher(Protocol):
    """Told whenever a runtime's replica changes state or goes away (ProcessRuntime takes one
    in its constructor). Called synchronously, from the runtime's own tasks: a draining
    replica must leave the router before another request can be dispatched to it."""

    def replicas_changed(self, replicas: list[ReplicaStatus]) -> None: ...


class InFlightCounter(Protocol):
    """Requests the plane's router has in flight on a replica: what a drain waits on (the
    router is one; ProcessRuntime takes one in its constructor). None: not known now (the
    router's load report is stale); a drain waits on it as on a busy replica."""

    def replica_in_flight(self, replica_id: str) -> int | None: ...


class GpuInventory(Protocol):
    """The GPUs a runtime gives its replicas (ProcessRuntime is one; the agent takes one in
    its constructor and reports it upward, so that placement never counts more GPUs here
    than the plane has). Returns at once, from memory."""

    def gpu_capacity(self) -> tuple[int, int]:
        """(total, free) GPUs of this plane's runtime."""
        ...


class ClosableRuntime(Runtime, Protocol):
    """A runtime that holds resources (clients, watch tasks) until closed by its owner."""

    async def close(self, *, stop_replicas: bool = True) -> None:
        """Release them; ``stop_replicas=False`` leaves replicas running for the next agent
        process to adopt."""
        ...
