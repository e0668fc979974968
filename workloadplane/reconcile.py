"""Pure reconcile: desired snapshot + observed replicas → actions. No I/O; the clock is an
argument.

Level-based: calling it again with the same inputs after the actions took effect returns
nothing. Rules, per deployment:
- ``failed`` replicas are stopped (and a replacement started, since they do not count);
- replicas of deployments no longer desired are stopped if still starting, drained if ready;
- the current revision gets exactly ``target`` starting+ready replicas (the local
  autoscaler's wish clamped to the quota; ``min`` when it has no wish), split over the
  deployment's ``pool_quotas``: replicas stay where they are while their pool's quota allows,
  new ones go to the most preferred pool with room, and a shrinking pool gives up its
  newest replicas (starting ones are stopped first, then ready ones drained);
- **leaving** replicas — an old revision, a pool the deployment no longer uses, or an
  instance the control plane marked draining (spot notice, cordoned node) — are replaced
  first and drained only as replacements become ready, so serving capacity never drops
  below ``target``; a leaving replica on an instance whose ``drain_deadline`` is less than
  ``drain_lead`` away is drained at once, ready replacement or not, so that its in-flight
  requests finish before the machine goes; ``hold_leaving`` more are kept while their
  replacements start on another cluster (the control plane lowers it as they get ready);
- new replicas are put on a non-draining instance of their pool with free GPUs (none free,
  or no instance listed: the pool's capacity is not tracked per machine here);
- ``draining`` replicas are left alone (the runtime stops them when they are done).

Make before break applies to disappearance too (``keep_dropped``): a deployment a newer
snapshot no longer lists, which had traffic here within its autoscaling window, keeps being
served as it was for a grace period (``DEFAULT_DISAPPEARANCE_GRACE``) — a control plane that
lost sight of the planes must not empty them — unless the snapshot lists it in ``retired``
(a user deleted it): then it is drained at once. One without recent traffic goes at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from controlplane.contracts import (
    DeploymentDesired,
    DesiredState,
    InstanceDesired,
    ReplicaState,
    ReplicaStatus,
    RevisionSpec,
)

DEFAULT_DRAIN_LEAD = timedelta(seconds=30)
DEFAULT_DISAPPEARANCE_GRACE = timedelta(seconds=120)


@dataclass(frozen=True)
class StartReplica:
    deployment: str
    spec: RevisionSpec
    pool: str | None = None
    instance: str | None = None
    serves: str = ""
    """A rollout lane: the deployment name its replica answers to."""


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


@dataclass(frozen=True)
class _Slot:
    pool: str | None
    min: int
    max: int


def _slots(deployment: DeploymentDesired) -> list[_Slot]:
    if not deployment.pool_quotas:  # one pool-agnostic slot: the deployment's quota
        return [_Slot(None, deployment.quota.min, deployment.quota.max)]
    return [_Slot(q.pool, q.min, q.max) for q in deployment.pool_quotas]


def split_target(slots: Sequence[_Slot], active: Sequence[int], target: int) -> list[int]:
    """``target`` replicas over the slots: each keeps what it runs within [min, max]; more go
    to the most preferred slots with room (the first takes what no max allows), fewer come
    from the least preferred ones down to their min."""
    want = [max(s.min, min(s.max, n)) for s, n in zip(slots, active, strict=True)]
    missing = target - sum(want)
    for i, s in enumerate(slots):
        if missing <= 0:
            break
        add = min(missing, max(0, s.max - want[i]))
        want[i] += add
        missing -= add
    if missing > 0 and want:
        want[0] += missing
    for i in reversed(range(len(slots))):
        if missing >= 0:
            break
        cut = min(-missing, want[i] - slots[i].min)
        want[i] -= cut
        missing += cut
    return want


class _Instances:
    """Instances of this cluster and their GPUs in use, updated as starts are planned."""

    def __init__(
        self,
        desired: DesiredState,
        replicas: Sequence[ReplicaStatus],
        now: datetime | None,
        drain_lead: timedelta,
    ) -> None:
        self.by_id: dict[str, InstanceDesired] = {i.id: i for i in desired.instances}
        self.now, self.drain_lead = now, drain_lead
        gpus = {d.name: d.spec.gpus_per_replica for d in desired.deployments}
        self.used: dict[str, int] = {}
        for r in replicas:
            if r.instance is not None and r.state != "failed":
                self.used[r.instance] = self.used.get(r.instance, 0) + gpus.get(r.deployment, 0)

    def draining(self, replica: ReplicaStatus) -> InstanceDesired | None:
        inst = self.by_id.get(replica.instance or "")
        return inst if inst is not None and inst.draining else None

    def urgent(self, inst: InstanceDesired) -> bool:
        deadline = inst.drain_deadline
        return (
            self.now is not None and deadline is not None and self.now >= deadline - self.drain_lead
        )

    def place(self, pool: str | None, gpus: int) -> str | None:
        for inst in self.by_id.values():
            free = inst.gpus - self.used.get(inst.id, 0)
            if inst.pool == pool and not inst.draining and free >= gpus:
                self.used[inst.id] = self.used.get(inst.id, 0) + gpus
                return inst.id
        return None


def _leaving_reason(
    replica: ReplicaStatus, revision: str, pools: set[str | None], instances: _Instances
) -> str | None:
    if replica.revision != revision:
        return "replaced by a new revision"
    if (inst := instances.draining(replica)) is not None:
        return f"instance {inst.id} is draining"
    if None not in pools and replica.pool is not None and replica.pool not in pools:
        return f"pool {replica.pool} no longer used"
    return None


def leaving_replicas(desired: DesiredState, replicas: Sequence[ReplicaStatus]) -> set[str]:
    """Ids of the replicas reconcile replaces and drains (old revision, a draining instance,
    a pool no longer used): not capacity to scale on, though their requests are load."""
    instances = _Instances(desired, replicas, None, DEFAULT_DRAIN_LEAD)
    rules = {d.name: (d.spec.revision, {s.pool for s in _slots(d)}) for d in desired.deployments}
    return {
        r.replica_id
        for r in replicas
        if r.deployment in rules and _leaving_reason(r, *rules[r.deployment], instances) is not None
    }


def _reconcile_deployment(
    deployment: DeploymentDesired,
    replicas: Sequence[ReplicaStatus],
    target: int,
    instances: _Instances,
) -> list[Action]:
    slots = _slots(deployment)
    pools = {s.pool for s in slots}
    revision = deployment.spec.revision
    actions: list[Action] = []
    staying: list[ReplicaStatus] = []
    leaving: list[tuple[ReplicaStatus, str]] = []
    for r in replicas:
        reason = _leaving_reason(r, revision, pools, instances)
        if reason is None:
            staying.append(r)
        elif r.state == "starting":
            actions.append(StopReplica(r.replica_id, f"{reason}, not ready yet"))
        else:
            leaving.append((r, reason))

    # a replica that does not say its pool (started by an older agent) counts in the first
    groups: list[list[ReplicaStatus]] = [[] for _ in slots]
    index = {s.pool: i for i, s in enumerate(slots)}
    for r in staying:
        groups[index.get(r.pool, 0)].append(r)
    want = split_target(slots, [len(g) for g in groups], target)
    ready = 0
    for slot, group, n in zip(slots, groups, want, strict=True):
        starting = _by_id([r for r in group if r.state == "starting"])
        up = _by_id([r for r in group if r.state == "ready"])
        for _ in range(n - len(group)):
            instance = instances.place(slot.pool, deployment.spec.gpus_per_replica)
            actions.append(
                StartReplica(
                    deployment.name, deployment.spec, slot.pool, instance, deployment.serves
                )
            )
        excess = max(0, len(group) - n)
        for r in reversed(starting):
            if excess == 0:
                break
            actions.append(StopReplica(r.replica_id, "above target"))
            excess -= 1
        for r in reversed(up[len(up) - excess :] if excess else []):
            actions.append(DrainReplica(r.replica_id, "above target"))
        ready += len(up) - excess

    # make before break: leaving replicas serve until replacements are ready — here, or on
    # other clusters while the control plane holds them — unless their machine is about to go
    keep, hold = max(0, target - ready), deployment.hold_leaving
    for r, reason in sorted(leaving, key=lambda x: x[0].replica_id):
        inst = instances.draining(r)
        if inst is not None and instances.urgent(inst):
            actions.append(DrainReplica(r.replica_id, f"{reason}, deadline near"))
        elif keep > 0:
            keep -= 1
        elif inst is not None and hold > 0:
            hold -= 1
        else:
            actions.append(DrainReplica(r.replica_id, reason))
    return actions


def reconcile(
    desired: DesiredState,
    replicas: Sequence[ReplicaStatus],
    wanted: Mapping[str, int] | None = None,
    *,
    now: datetime | None = None,
    drain_lead: timedelta = DEFAULT_DRAIN_LEAD,
) -> list[Action]:
    """Actions that move ``replicas`` toward ``desired``. ``wanted``: the local autoscaler's
    replica count per deployment (clamped into each quota). ``now``: the agent's clock, for
    draining instances' deadlines (None: no deadline is ever near)."""
    wanted = wanted or {}
    instances = _Instances(desired, replicas, now, drain_lead)
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
        actions += _reconcile_deployment(
            deployment, by_deployment.get(deployment.name, []), target, instances
        )
    return actions


@dataclass(frozen=True)
class Kept:
    """A deployment a snapshot dropped, still served as it was until ``until``."""

    deployment: DeploymentDesired
    until: datetime


def keep_dropped(
    served: Sequence[DeploymentDesired],
    kept: Mapping[str, Kept],
    desired: DesiredState,
    last_traffic: Mapping[str, datetime],
    now: datetime,
    grace: timedelta = DEFAULT_DISAPPEARANCE_GRACE,
) -> dict[str, Kept]:
    """The deployments to keep serving although ``desired`` does not list them.

    ``served``: what the plane served until now (kept ones included); ``kept``: what this
    returned last time; ``last_traffic``: when each deployment last had a request in flight
    or queued here. A dropped deployment is kept until ``now + grace`` if it had traffic
    within its autoscaling window; one already kept stays until its ``until`` (the grace
    does not restart). Listed again, or in ``desired.retired`` — itself, or for a rollout
    lane the deployment it serves (a deleted deployment's lanes go with it) — it is not
    kept."""
    listed = {d.name for d in desired.deployments}
    retired = set(desired.retired)
    out: dict[str, Kept] = {}
    for d in served:
        if d.name in listed or d.name in retired or (d.serves and d.serves in retired):
            continue
        before = kept.get(d.name)
        if before is not None:
            if now < before.until:
                out[d.name] = before
            continue
        seen = last_traffic.get(d.name)
        window = timedelta(seconds=d.autoscaling.window_seconds)
        if seen is not None and now - seen <= window and grace > timedelta(0):
            out[d.name] = Kept(d, now + grace)
    return out


def with_kept(desired: DesiredState, kept: Mapping[str, Kept]) -> DesiredState:
    """``desired`` with the kept deployments added, as reconcile and the router see it."""
    if not kept:
        return desired
    extra = [k.deployment for _, k in sorted(kept.items())]
    return desired.model_copy(update={"deployments": [*desired.deployments, *extra]})


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


def lane_adoptions(
    desired: DesiredState, replicas: Sequence[ReplicaStatus]
) -> list[tuple[str, str]]:
    """(replica id, deployment) for each replica of a rollout lane the snapshot no longer
    lists whose revision is now its deployment's own: a promoted canary's replicas join
    the deployment (no restart, no gap while new ones would start) instead of draining.
    A rolled-back lane's replicas run another revision than the deployment's: they drain."""
    entries = {d.name: d for d in desired.deployments}
    out: list[tuple[str, str]] = []
    for r in replicas:
        if not r.serves or r.deployment in entries or r.state not in ("starting", "ready"):
            continue
        owner = entries.get(r.serves)
        if owner is not None and not owner.serves and owner.spec.revision == r.revision:
            out.append((r.replica_id, owner.name))
    return out
