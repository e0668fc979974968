"""Pure reconcile: desired snapshot + observed replicas → actions. No I/O, no clock.

Level-based: calling it again with the same inputs after the actions took effect returns
nothing. Rules, per deployment:
- ``failed`` replicas are stopped (and a replacement started, since they do not count);
- replicas of deployments no longer desired are stopped if still starting, drained if ready;
- the current revision gets exactly ``target`` starting+ready replicas (the local
  autoscaler's wish clamped to the quota; ``min`` when it has no wish); excess starting
  ones are stopped first, then ready ones drained;
- a revision change rolls: old starting replicas are stopped, old ready ones are drained only
  as new ones become ready, so serving capacity never drops below ``target``;
- ``draining`` replicas are left alone (the runtime stops them when they are done).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    ReplicaState,
    ReplicaStatus,
    RevisionSpec,
)


@dataclass(frozen=True)
class StartReplica:
    deployment: str
    spec: RevisionSpec


@dataclass(frozen=True)
class StopReplica:
    replica_id: str
    reason: str


@dataclass(frozen=True)
class DrainReplica:
    replica_id: str
    reason: str


Action = StartReplica | StopReplica | DrainReplica


def target_replicas(deployment: DeploymentDesired, wanted: int | None) -> int:
    """The autoscaler's wish clamped into the quota; the quota's min without a wish."""
    quota = deployment.quota
    wish = quota.min if wanted is None else wanted
    return max(quota.min, min(quota.max, wish))


def _by_id(replicas: Sequence[ReplicaStatus]) -> list[ReplicaStatus]:
    return sorted(replicas, key=lambda r: r.replica_id)


def _reconcile_deployment(
    deployment: DeploymentDesired, replicas: Sequence[ReplicaStatus], target: int
) -> list[Action]:
    revision = deployment.spec.revision
    current = [r for r in replicas if r.revision == revision]
    old = [r for r in replicas if r.revision != revision]
    cur_starting = _by_id([r for r in current if r.state == "starting"])
    cur_ready = _by_id([r for r in current if r.state == "ready"])
    actions: list[Action] = []

    actions += [StopReplica(r.replica_id, "old revision, not ready yet") for r in old
                if r.state == "starting"]  # fmt: skip

    active = len(cur_starting) + len(cur_ready)
    if active < target:
        actions += [StartReplica(deployment.name, deployment.spec)] * (target - active)
    elif active > target:
        excess = active - target
        for r in reversed(cur_starting):
            if excess == 0:
                break
            actions.append(StopReplica(r.replica_id, "above target"))
            excess -= 1
        for r in reversed(cur_ready[len(cur_ready) - excess :] if excess else []):
            actions.append(DrainReplica(r.replica_id, "above target"))
        cur_ready = cur_ready[: len(cur_ready) - excess]

    old_ready = _by_id([r for r in old if r.state == "ready"])
    keep_old = max(0, target - len(cur_ready))
    for r in old_ready[keep_old:]:
        actions.append(DrainReplica(r.replica_id, "replaced by a new revision"))
    return actions


def reconcile(
    desired: DesiredState,
    replicas: Sequence[ReplicaStatus],
    wanted: Mapping[str, int] | None = None,
) -> list[Action]:
    """Actions that move ``replicas`` toward ``desired``. ``wanted``: the local autoscaler's
    replica count per deployment (clamped into each quota)."""
    wanted = wanted or {}
    by_deployment: dict[str, list[ReplicaStatus]] = {}
    actions: list[Action] = []
    for replica in _by_id(replicas):
        if replica.state == "failed":
            actions.append(StopReplica(replica.replica_id, "failed"))
        elif replica.state != "draining":
            by_deployment.setdefault(replica.deployment, []).append(replica)

    desired_names = {d.name for d in desired.deployments}
    for name, group in sorted(by_deployment.items()):
        if name in desired_names:
            continue
        for r in group:
            if r.state == "starting":
                actions.append(StopReplica(r.replica_id, "deployment removed"))
            else:
                actions.append(DrainReplica(r.replica_id, "deployment removed"))

    for deployment in desired.deployments:
        target = target_replicas(deployment, wanted.get(deployment.name))
        actions += _reconcile_deployment(deployment, by_deployment.get(deployment.name, []), target)
    return actions


FactKind = Literal["started", "failed"]


def replica_transitions(
    previous: Mapping[str, ReplicaState], current: Sequence[ReplicaStatus]
) -> list[tuple[FactKind, ReplicaStatus]]:
    """Replicas that became ``ready`` or ``failed`` since ``previous`` (id → state)."""
    changes: list[tuple[FactKind, ReplicaStatus]] = []
    for replica in _by_id(current):
        before = previous.get(replica.replica_id)
        if replica.state == "ready" and before not in ("ready", "draining"):
            changes.append(("started", replica))
        elif replica.state == "failed" and before != "failed":
            changes.append(("failed", replica))
    return changes
