"""What a plane may claim: its reports checked against what it was given. Pure, no I/O.

A plane's NATS credentials let it publish on its own subjects only, but what it says there
moves placement and money. So before a report counts:

- demand only for deployments in that cluster's current desired state, at most
  ``Bounds.demand_factor`` × the deployment's ``max_replicas`` and at most
  ``Bounds.demand_max``; in-flight and queue depth at most their bounds (clamped);
- replicas only of deployments it was given, only on its pools (when the replica names one)
  and only on the instances it was given (when it was given any and the replica names one);
  per deployment at most as many as its demand may be (``demand_cap``).

A rejected part is dropped (or clamped) and named in a `Rejection`; the rest of the report
still counts: a heartbeat with one bad entry still proves liveness. What the plane was told
to retire (a deleted deployment, a finished rollout's lane or a shadow, the snapshot's
`retired`) it drains and may still report for a while: that is dropped without a
rejection (it is what the plane was asked to do, not a forgery).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.contracts import DeploymentObserved, ObservedState, ReplicaStatus

REASONS = (
    "deployment_not_given",
    "pool_not_given",
    "instance_not_given",
    "replica_bound",
    "demand_bound",
    "in_flight_bound",
    "queue_depth_bound",
)


@dataclass(frozen=True)
class Given:
    """What one cluster was given: deployment name → its `max_replicas` (fleet-wide), the
    names of the cluster's pools, the provider ids of the instances held for it."""

    deployments: Mapping[str, int]
    pools: frozenset[str] = frozenset()
    instances: frozenset[str] = frozenset()
    retired: frozenset[str] = frozenset()
    """Entries the cluster was told to retire: reports of them do not count, silently."""


@dataclass(frozen=True)
class Bounds:
    demand_factor: float = 2.0
    demand_max: int = 1000
    in_flight_max: int = 100_000
    queue_depth_max: int = 100_000
    tokens_per_s_max: int = 10_000_000
    """The most tokens per second one deployment's router may report (since its last
    recorded report)."""
    bytes_per_s_max: int = 2_000_000_000
    """The same for response bytes."""
    facts_per_s: float = 50.0
    """Facts one cluster may send per second, sustained (``ReportBudget``)..."""
    facts_burst: float = 5000.0
    """... and at once (a plane restarting reports each replica it finds)."""
    heartbeats_per_s: float = 10.0
    """Heartbeats one cluster may have recorded per second, sustained (an agent sends one
    every few seconds): each costs a database transaction in the one consumer every plane
    shares, so a plane publishing them in a loop delayed everyone's..."""
    heartbeats_burst: float = 100.0
    """... and at once (a backlog after the bus was away: only the newest counts anyway)."""


class ReportBudget:
    """A token bucket per cluster, one for its facts and one for its heartbeats: a plane
    flooding facts (each with a fresh id) made an event row and asked for a re-plan each,
    and each heartbeat is a transaction in the consumer every plane shares; past its budget
    a report is dropped and counted (``fact_rate``, ``heartbeat_rate``). Pure: the caller
    passes the time (seconds)."""

    MAX_CLUSTERS = 10_000

    def __init__(self, per_s: float, burst: float) -> None:
        self.per_s, self.burst = per_s, burst
        self._level: dict[str, tuple[float, float]] = {}  # cluster → (tokens, at)

    def allows(self, cluster: str, now: float) -> bool:
        """Whether ``cluster`` may have a fact recorded at ``now`` (spends nothing)."""
        tokens, at = self._level.get(cluster, (self.burst, now))
        tokens = min(self.burst, tokens + max(now - at, 0.0) * self.per_s)
        if len(self._level) >= self.MAX_CLUSTERS and cluster not in self._level:
            self._level.clear()  # clusters come and go: a full map starts every one afresh
        self._level[cluster] = (tokens, max(now, at))
        return tokens >= 1.0

    def spend(self, cluster: str) -> None:
        """A fact of ``cluster`` was recorded (after ``allows``): a redelivery that failed
        for want of the database, or a duplicate, spends nothing."""
        tokens, at = self._level.get(cluster, (self.burst, 0.0))
        self._level[cluster] = (tokens - 1.0, at)


@dataclass(frozen=True)
class Rejection:
    reason: str
    what: str
    detail: str

    @property
    def message(self) -> str:
        return f"{self.what}: {self.detail}"


@dataclass(frozen=True)
class Checked:
    """The report with what may not count removed or clamped, and why."""

    state: ObservedState
    rejections: list[Rejection] = field(default_factory=list)


def draining(entry: str, given: Given) -> bool:
    """Was the cluster told to retire ``entry`` (and not given it again)? Its reports do
    not count, and are no rejection: the plane drains what it was asked to."""
    return entry in given.retired and entry not in given.deployments


def check_replica(replica: ReplicaStatus, given: Given) -> Rejection | None:
    """Why this replica may not be recorded for the cluster (None: it may)."""
    what = f"replica {replica.replica_id} of {replica.deployment}"
    if replica.deployment not in given.deployments:
        return Rejection(
            "deployment_not_given", what, "the deployment is not in this cluster's desired state"
        )
    if replica.pool is not None and replica.pool not in given.pools:
        return Rejection("pool_not_given", what, f"pool {replica.pool} is not this cluster's")
    if replica.instance is not None and given.instances and replica.instance not in given.instances:
        return Rejection(
            "instance_not_given", what, f"instance {replica.instance} is not held for this cluster"
        )
    return None


def demand_cap(max_replicas: int, bounds: Bounds) -> int:
    return min(bounds.demand_max, max(1, int(max_replicas * bounds.demand_factor)))


def check_deployment(
    observed: DeploymentObserved, given: Given, bounds: Bounds
) -> tuple[DeploymentObserved | None, list[Rejection]]:
    """The entry as it may count (None: not at all) and what was wrong with it."""
    what = f"report on {observed.name}"
    if observed.name not in given.deployments:
        detail = "the deployment is not in this cluster's desired state"
        return None, [Rejection("deployment_not_given", what, detail)]
    rejections: list[Rejection] = []
    cap = demand_cap(given.deployments[observed.name], bounds)
    clamped: dict[str, int] = {}
    for key, bound, reason in (
        ("demand", cap, "demand_bound"),
        ("in_flight", bounds.in_flight_max, "in_flight_bound"),
        ("queue_depth", bounds.queue_depth_max, "queue_depth_bound"),
    ):
        value = getattr(observed, key)
        if value > bound:
            clamped[key] = bound
            rejections.append(
                Rejection(reason, what, f"{key} {value} above {bound}, counted as {bound}")
            )
    return (observed.model_copy(update=clamped) if clamped else observed), rejections


def check_observed(state: ObservedState, given: Given, bounds: Bounds | None = None) -> Checked:
    """The heartbeat as it may count."""
    bounds = bounds or Bounds()
    rejections: list[Rejection] = []
    replicas = []
    per_deployment: dict[str, int] = {}
    for replica in state.replicas:
        if draining(replica.deployment, given):
            continue
        why = check_replica(replica, given)
        if why is not None:
            rejections.append(why)
            continue
        name = replica.deployment
        count = per_deployment[name] = per_deployment.get(name, 0) + 1
        cap = demand_cap(given.deployments[name], bounds)
        if count <= cap:
            replicas.append(replica)
        elif count == cap + 1:  # one rejection for all the extra ones
            detail = f"more than {cap} replicas reported; those after the {cap}th not recorded"
            rejections.append(Rejection("replica_bound", f"replicas of {name}", detail))
    deployments = []
    for observed in state.deployments:
        if draining(observed.name, given):
            continue
        kept, why_not = check_deployment(observed, given, bounds)
        rejections.extend(why_not)
        if kept is not None:
            deployments.append(kept)
    if (
        not rejections
        and len(replicas) == len(state.replicas)
        and len(deployments) == len(state.deployments)
    ):
        return Checked(state)
    return Checked(
        state.model_copy(update={"replicas": replicas, "deployments": deployments}), rejections
    )
