"""Record what workload planes report (heartbeats and facts) in PostgreSQL.

Implements `controlplane.bus.consumer.ObservedStateSink`. Idempotent on the message id: a
fact becomes an event whose id is the message id, so a redelivered fact changes nothing.
Reports are checked against what the plane was given (`controlplane.trust`) before they
count; what is rejected is an event `ReportRejected` on the cluster (once per reason per
minute) and the rest of the report still counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from controlplane import rollouts as canary
from controlplane import shadows
from controlplane.contracts import (
    DesiredStateApplied,
    Fact,
    NodeUnhealthy,
    ObservedState,
    RejectedMessageError,
    ReplicaFailed,
    ReplicasScaled,
    ReplicaStarted,
    SpotInterruptionNoticed,
    whole_number,
)
from controlplane.db.columns import cluster_status, deployment_autoscaling, set_status
from controlplane.db.models import Cluster, Deployment, Event, Instance, Replica
from controlplane.db.session import transaction
from controlplane.procurement import facts as procurement
from controlplane.services import costs, epochs, rollout_windows
from controlplane.services.desired import desired_state, release_holds
from controlplane.status import PoolCapacity
from controlplane.trust import (
    Bounds,
    Given,
    Rejection,
    ReportBudget,
    check_observed,
    check_replica,
    draining,
)

log = logging.getLogger("gpufleet.observed")
CLOCK_SKEW = timedelta(seconds=5)
"""How far in the future of its receipt a fact's own time is believed (a plane's clock may
run ahead a little; beyond that, the receive time stands)."""
Hook = Callable[[str], None]
REJECTION_EVENT_EVERY = timedelta(minutes=1)


class DbSink:
    """`on_change(reason)` is called after commit when placement should look again.
    `bounds`: what a plane may report (`controlplane.trust.Bounds`)."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        on_change: Hook | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        self._factory = factory
        self._on_change = on_change or (lambda reason: None)
        self._bounds = bounds or Bounds()
        self._rates = costs.UsageRates(self._bounds.tokens_per_s_max, self._bounds.bytes_per_s_max)
        self._noted: dict[tuple[str, str], datetime] = {}  # (cluster, reason) → last event
        self._handed = HandedCache()
        self._facts = ReportBudget(self._bounds.facts_per_s, self._bounds.facts_burst)
        self._heartbeats = ReportBudget(
            self._bounds.heartbeats_per_s, self._bounds.heartbeats_burst
        )
        self._over_budget_logged: dict[tuple[str, str], datetime] = {}

    @staticmethod
    def transient(exc: BaseException) -> bool:
        """The database is away (retry for as long as it is), not a report it fails on."""
        return isinstance(exc, OperationalError) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated
        )

    async def record_observed(
        self, cluster: str, state: ObservedState, received_at: datetime
    ) -> list[str]:
        """Returns the reasons of what was rejected (one per rejected part)."""
        if not self._heartbeats.allows(cluster, received_at.timestamp()):
            self._over_budget(cluster, "heartbeats", received_at)
            return ["heartbeat_rate"]
        with _refused_by_the_database(state):
            reason, rejected = await asyncio.to_thread(self._observed, cluster, state, received_at)
        self._heartbeats.spend(cluster)
        if reason:
            self._on_change(reason)
        return rejected

    async def record_fact(self, cluster: str, fact: Fact, received_at: datetime) -> list[str]:
        if not self._facts.allows(cluster, received_at.timestamp()):
            self._over_budget(cluster, "facts", received_at)
            return ["fact_rate"]
        with _refused_by_the_database(fact):
            reason, rejected = await asyncio.to_thread(
                self._checked_fact, cluster, fact, received_at
            )
        self._facts.spend(cluster)  # handled: a try that failed for the database spends none
        if reason:
            self._on_change(reason)
        return rejected

    def _over_budget(self, cluster: str, what: str, at: datetime) -> None:
        """Log, once a minute per cluster and kind, that its reports are being dropped."""
        last = self._over_budget_logged.get((cluster, what))
        if last is not None and at - last < timedelta(minutes=1):
            return
        if len(self._over_budget_logged) >= ReportBudget.MAX_CLUSTERS:
            self._over_budget_logged.clear()
        self._over_budget_logged[(cluster, what)] = at
        if what == "facts":
            per_s, burst = self._bounds.facts_per_s, self._bounds.facts_burst
            more = "counted as fact_rate; its heartbeats still count"
        else:
            per_s, burst = self._bounds.heartbeats_per_s, self._bounds.heartbeats_burst
            more = "counted as heartbeat_rate; the newest recorded still counts"
        log.warning(
            "%s: sends %s faster than %g/s (burst %g): dropping them until it slows (%s)",
            cluster,
            what,
            per_s,
            burst,
            more,
        )

    def _reject(
        self, session: Session, cluster: Cluster, rejections: list[Rejection], at: datetime
    ) -> list[str]:
        """Record the rejections as `ReportRejected` events, once per reason per minute,
        and log one line per reason (a forged report may hold thousands)."""
        counts = Counter(r.reason for r in rejections)
        for r in {r.reason: r for r in reversed(rejections)}.values():  # each reason's first
            more = f" (and {counts[r.reason] - 1} more)" if counts[r.reason] > 1 else ""
            log.warning("%s: report rejected (%s): %s%s", cluster.name, r.reason, r.message, more)
        for r in rejections:
            key = (cluster.name, r.reason)
            last = self._noted.get(key)
            if last is not None and at - last < REJECTION_EVENT_EVERY:
                continue
            self._noted[key] = at
            session.add(
                Event(
                    time=at,
                    type="ReportRejected",
                    object_kind="Cluster",
                    object_id=cluster.id,
                    object_name=cluster.name,
                    message=f"{cluster.name}: report rejected ({r.reason}): {r.message}; "
                    "the rest of the report counts",
                    data={"reason": r.reason, "what": r.what, "detail": r.detail},
                )
            )
        return [r.reason for r in rejections]

    def _observed(
        self, name: str, state: ObservedState, received_at: datetime
    ) -> tuple[str | None, list[str]]:
        with transaction(self._factory) as session:
            _lock_deployments(session, state)
            # locked (after its deployments, as a deployment write takes them): two bus
            # processes recording two heartbeats of one plane at once both passed the
            # check below, and the older one could commit last
            cluster = _cluster(session, name, lock=True)
            if cluster is None:
                return None, []
            if cluster.last_heartbeat_at and received_at < cluster.last_heartbeat_at:
                return None, []  # an older heartbeat redelivered late: the newer one stands
            checked = check_observed(state, given_to(session, cluster, self._handed), self._bounds)
            rejected = self._reject(session, cluster, checked.rejections, received_at)
            state = checked.state
            cluster.last_heartbeat_at = received_at
            cluster.agent_version = state.agent_version or cluster.agent_version
            epochs.note_applied(session, cluster, state.observed_epoch, state.observed_generation)
            reason = _revive(session, cluster)
            release_holds(session, _sync_replicas(session, cluster, state))
            costs.record_usage(session, cluster.name, state.deployments, received_at, self._rates)
            rollout_windows.record_outcomes(session, cluster.name, state.deployments)
            if _record_demand(session, cluster, state):
                reason = reason or "demand"
            return _record_capacity(session, cluster, state, received_at) or reason, rejected

    def _fact(self, name: str, fact: Fact, received_at: datetime) -> str | None:
        """Record one fact; why placement should look again (None: no need)."""
        return self._checked_fact(name, fact, received_at)[0]

    def _checked_fact(
        self, name: str, fact: Fact, received_at: datetime
    ) -> tuple[str | None, list[str]]:
        with transaction(self._factory) as session:
            if session.get(Event, str(fact.id)) is not None:
                return None, []
            cluster = _cluster(session, name)
            if cluster is None:
                return None, []
            if isinstance(fact, ReplicaStarted | ReplicaFailed):
                given = given_to(session, cluster, self._handed)
                if draining(fact.replica.deployment, given):
                    return None, []
                why = check_replica(fact.replica, given)
                if why is not None:
                    return None, self._reject(session, cluster, [why], received_at)
            if isinstance(fact, SpotInterruptionNoticed | NodeUnhealthy):
                why = _instance_not_held(session, cluster, fact.instance_id)
                if why is not None:  # a plane speaks only of its own machines
                    return None, self._reject(session, cluster, [why], received_at)
            session.add(_event_for(cluster, fact, received_at))
            if isinstance(fact, DesiredStateApplied):
                epochs.note_applied(session, cluster, fact.epoch, fact.generation)
            if isinstance(fact, ReplicaStarted | ReplicaFailed):
                ready = _upsert_replica(session, cluster, fact.replica.model_dump())
                release_holds(session, [ready] if ready else [])
            if isinstance(fact, SpotInterruptionNoticed):
                procurement.note_interruption(
                    session, fact.instance_id, fact.deadline, received_at, f"agent {name}"
                )
            if isinstance(fact, NodeUnhealthy):
                procurement.note_unhealthy(
                    session, fact.instance_id, fact.reason or "reported by the agent", received_at
                )
            if fact.type in ("spot_interruption_noticed", "node_unhealthy", "capacity_exhausted"):
                return fact.type, []
            return None, []


@contextlib.contextmanager
def _refused_by_the_database(report: ObservedState | Fact) -> Iterator[None]:
    """A value the database refuses (too long for its column, out of its range, a NUL) is a
    bad report, not a failure to retry: redelivered, it would fail for ever and hold the
    reports stream's ack floor, and with it every plane's liveness (docs/bus.md). The
    contracts bound what they can; this is the net under them."""
    try:
        yield
    except DataError as exc:
        detail = f"{report.type} {report.id}: the database refused a value ({exc.orig!r})"
        raise RejectedMessageError("invalid_value", detail[:300]) from None


def _instance_not_held(session: Session, cluster: Cluster, ref: str) -> Rejection | None:
    """Why a plane's notice about instance ``ref`` may not count: it names a machine held
    for another cluster (or none), which it could otherwise drain, cordon or get released."""
    inst = procurement.find_instance(session, ref)
    if inst is not None and inst.cluster_id == cluster.id:
        return None
    return Rejection(
        "instance_not_given", f"notice on instance {ref[:128]}", "it is not held for this cluster"
    )


@dataclass(frozen=True)
class Handed:
    """What one desired-state generation handed a cluster: entry → the deployment it serves
    (a rollout lane: its deployment), the provider ids of the instances held for it, the
    entries it was told to retire."""

    served: Mapping[str, str]
    instances: frozenset[str]
    retired: frozenset[str]


def handed(session: Session, cluster: Cluster) -> Handed:
    """Worked out from the cluster's current desired state (a dozen queries). Nothing was
    ever placed on a cluster at desired generation 0: it was handed nothing."""
    if cluster.desired_generation < 1:
        return Handed(served={}, instances=frozenset(), retired=frozenset())
    desired = desired_state(session, cluster)
    return Handed(
        served={d.name: d.serves or d.name for d in desired.deployments},
        instances=frozenset(i.id for i in desired.instances),
        retired=frozenset(desired.retired),
    )


class HandedCache:
    """`handed` per cluster, kept while the cluster's desired (epoch, generation) stays: what
    a plane was handed changes only with them (the snapshot it runs is published when the
    generation moves). Every heartbeat and replica fact is checked against it; working it
    out each time was half the cost of recording a heartbeat, and the bus fell behind the
    planes it serves. At most ``most`` clusters are kept (then it starts afresh)."""

    def __init__(self, most: int = 4096) -> None:
        self._most = most
        self._by_cluster: dict[str, tuple[tuple[int, int], Handed]] = {}

    def __call__(self, session: Session, cluster: Cluster) -> Handed:
        key = (cluster.desired_epoch, cluster.desired_generation)
        kept = self._by_cluster.get(cluster.id)
        if kept is not None and kept[0] == key:
            return kept[1]
        value = handed(session, cluster)
        if len(self._by_cluster) >= self._most and cluster.id not in self._by_cluster:
            self._by_cluster.clear()
        self._by_cluster[cluster.id] = (key, value)
        return value


def given_to(
    session: Session, cluster: Cluster, handed_to: Callable[[Session, Cluster], Handed] = handed
) -> Given:
    """What the cluster was given: what its desired state handed it (``handed_to``: how to
    get that, e.g. a `HandedCache`), each deployment with its fleet-wide max replicas (read
    now: a deployment's bounds are checked as they stand), its pools."""
    pools = frozenset(p.name for p in cluster.pools)
    out = handed_to(session, cluster)
    names = sorted(set(out.served.values()))
    rows = session.scalars(select(Deployment).where(Deployment.name.in_(names))) if names else []
    most = {d.name: deployment_autoscaling(d).max_replicas for d in rows}
    return Given(
        deployments={entry: most[name] for entry, name in out.served.items() if name in most},
        pools=pools,
        instances=out.instances,
        retired=out.retired,
    )


def _cluster(session: Session, name: str, *, lock: bool = False) -> Cluster | None:
    query = select(Cluster).where(Cluster.name == name)
    # FOR NO KEY UPDATE: two heartbeats of one plane still wait for each other, inserts of
    # rows that refer to the cluster (replicas, placements, instances) do not
    locked = query.with_for_update(of=Cluster, key_share=True)
    cluster = session.scalars(locked if lock else query).first()
    if cluster is None:
        log.warning("report from unknown cluster %s ignored", name)
    return cluster


def _revive(session: Session, cluster: Cluster) -> str | None:
    if cluster.state in ("healthy", "cordoned"):
        return None
    old, cluster.state = cluster.state, "healthy"
    session.add(
        Event(
            type="ClusterHealthy",
            object_kind="Cluster",
            object_id=cluster.id,
            object_name=cluster.name,
            message=f"cluster {cluster.name} is healthy (was {old}); heartbeats arrive",
            data={"from": old, "to": "healthy"},
        )
    )
    return "cluster_healthy"


def _sync_replicas(session: Session, cluster: Cluster, state: ObservedState) -> list[str]:
    """Replace this cluster's replica rows by the report; the deployment ids of replicas that
    became ready."""
    reported = {r.replica_id for r in state.replicas}
    for row in session.scalars(select(Replica).where(Replica.cluster_id == cluster.id)):
        if row.name not in reported:
            session.delete(row)
    instances = _instance_ids(session, cluster)
    ready = [_upsert_replica(session, cluster, r.model_dump(), instances) for r in state.replicas]
    return [d for d in ready if d]


def _instance_ids(session: Session, cluster: Cluster) -> dict[str, str]:
    """Provider instance id (what agents report) → our instance row id, for one cluster."""
    rows = session.execute(
        select(Instance.provider_instance_id, Instance.id).where(
            Instance.cluster_id == cluster.id, Instance.provider_instance_id.is_not(None)
        )
    )
    return {provider_id: row_id for provider_id, row_id in rows if provider_id}


def _upsert_replica(
    session: Session,
    cluster: Cluster,
    replica: dict[str, Any],
    instances: dict[str, str] | None = None,
) -> str | None:
    """Insert or update one replica row; its deployment's id when it just became ready."""
    deployment_id = _deployment_id(session, replica["deployment"])
    if deployment_id is None:
        return None
    row = session.scalars(
        select(Replica).where(
            Replica.cluster_id == cluster.id, Replica.name == replica["replica_id"]
        )
    ).first()
    if row is None:
        row = Replica(
            name=replica["replica_id"], cluster_id=cluster.id, deployment_id=deployment_id
        )
        session.add(row)
    became_ready = replica["state"] == "ready" and row.state != "ready"
    row.state = replica["state"]
    row.endpoint = replica.get("endpoint")
    if instances is None and replica.get("instance"):
        instances = _instance_ids(session, cluster)
    row.instance_id = (instances or {}).get(replica.get("instance") or "")
    revision = whole_number(str(replica["revision"]), 9)  # a report's text; INTEGER column
    if revision is not None:
        row.revision = revision
    return deployment_id if became_ready else None


def _lock_deployments(session: Session, state: ObservedState) -> None:
    """Lock the deployments the report touches (their replicas, demand, waiting replicas)
    before the cluster row, in id order: a write to a deployment locks it and then its
    clusters (bump_desired), so taking the cluster first could deadlock with it."""
    names = {d.name for d in state.deployments} | {r.deployment for r in state.replicas}
    names = {(lane[0] if (lane := canary.lane_of(n)) else n) for n in names}
    if names:
        session.execute(
            select(Deployment.id)
            .where(Deployment.name.in_(sorted(names)))
            .order_by(Deployment.id)
            .with_for_update(key_share=True)  # FOR NO KEY UPDATE
        ).all()


def _deployment_id(session: Session, entry: str) -> str | None:
    """The deployment a desired-state entry runs: its own, or the one a rollout lane serves
    (a lane's replicas are the deployment's, at the lane's revision)."""
    lane = canary.lane_of(entry)
    name = lane[0] if lane else entry
    return session.scalar(select(Deployment.id).where(Deployment.name == name))


def _record_demand(session: Session, cluster: Cluster, state: ObservedState) -> bool:
    """Keep each cluster's demand and each deployment's sum; True when a sum changed."""
    # a rollout lane is sized by its rollout, a shadow by its spec, not by their load: their
    # demand adds nothing
    demand = {d.name: d.demand for d in state.deployments if not _is_lane(d.name)}
    if not set_status(cluster, demand=demand):
        return False
    session.flush()
    changed = False
    totals: dict[str, int] = {}
    for other in session.scalars(select(Cluster)):
        for dep, wanted in cluster_status(other).demand.items():
            totals[dep] = totals.get(dep, 0) + wanted
    for deployment in session.scalars(select(Deployment).where(Deployment.name.in_(list(totals)))):
        if deployment.demand_replicas != totals[deployment.name]:
            deployment.demand_replicas = totals[deployment.name]
            changed = True
    return changed


def _is_lane(entry: str) -> bool:
    return canary.lane_of(entry) is not None or shadows.shadow_of(entry) is not None


def occurred_at(fact: Fact, received_at: datetime) -> datetime:
    """When the fact happened: its envelope's time, but never after ``received_at`` plus
    ``CLOCK_SKEW`` (a plane's clock far ahead, or a forged time, does not date it later)."""
    happened = fact.time if fact.time.tzinfo else fact.time.replace(tzinfo=UTC)
    return min(happened, received_at + CLOCK_SKEW)


def _record_capacity(
    session: Session, cluster: Cluster, state: ObservedState, received_at: datetime
) -> str | None:
    """Keep what the plane reports of its pools; "capacity" when replicas newly wait for GPUs
    or a pool's size changed (so placement looks again), with an event saying why.

    The plane's GPUs are one set shared by all its pools, and it reports only the pools its
    desired state names (or none, when it was given nothing): a pool of the cluster it leaves
    out can get no more than its free GPUs. Forgetting such a pool instead would count its
    inventory again, place more there than the plane has, and flap (place, wait, withdraw,
    forget). Waiting replicas are kept with the desired version they were counted against."""
    pools = sorted(p.name for p in cluster.pools)
    before = cluster_status(cluster).capacity
    now: dict[str, PoolCapacity] = {}
    plan = (state.observed_epoch, state.observed_generation)
    for report in state.free_capacity:
        if report.pool is None or report.pool not in pools:
            continue  # no pool, or not one of this cluster's: nothing placement could use
        now[report.pool] = PoolCapacity(
            total_gpus=report.total_gpus,
            free_gpus=report.gpus,
            waiting_replicas=_by_deployment(report.waiting_replicas),
            reported_at=received_at,
            plan=plan,
        )
    sized = [r.gpus for r in state.free_capacity if r.total_gpus is not None]
    for pool in pools if sized else []:
        if pool not in now:
            free = min(sized)
            now[pool] = PoolCapacity(
                total_gpus=free, free_gpus=free, reported_at=received_at, plan=plan
            )
    if not now and not before:
        return None
    set_status(cluster, capacity={k: v.model_dump(mode="json") for k, v in now.items()})
    news = []
    for pool, cap in now.items():
        old = before.get(pool)
        waiting = cap.waiting_replicas
        if waiting and (old is None or old.waiting_replicas != waiting):
            used = (cap.total_gpus or 0) - cap.free_gpus
            who = ", ".join(f"{n} replica(s) of {d}" for d, n in sorted(waiting.items()))
            news.append(
                f"pool {pool}: {who} cannot start ({cap.free_gpus} of {cap.total_gpus} GPUs "
                f"free): placement counts only the {used} GPU(s) in use there until they can"
            )
        elif old is None or old.total_gpus != cap.total_gpus:
            news.append(f"pool {pool}: the plane has {cap.total_gpus} GPU(s)")
    if not news:
        return None
    session.add(
        Event(
            type="CapacityReported",
            object_kind="Cluster",
            object_id=cluster.id,
            object_name=cluster.name,
            message=f"{cluster.name}: " + "; ".join(news),
            data={pool: cap.model_dump(mode="json") for pool, cap in now.items()},
        )
    )
    return "capacity"


def _by_deployment(waiting: dict[str, int]) -> dict[str, int]:
    """Waiting replicas per deployment: a rollout lane's count for the deployment it serves."""
    out: dict[str, int] = {}
    for entry, n in waiting.items():
        lane = canary.lane_of(entry)
        if n > 0:
            out[lane[0] if lane else entry] = out.get(lane[0] if lane else entry, 0) + n
    return out


def _event_for(cluster: Cluster, fact: Fact, received_at: datetime) -> Event:
    """Deployment-scoped facts (scaling, capacity) are filed under the deployment, so that
    `gpufleet describe deployment X` shows them; the rest under the cluster. ``time``: when
    the control plane received it; ``occurred_at``: when it happened on the plane (facts
    raised while the control plane was down arrive late)."""
    data = fact.model_dump(mode="json", exclude={"id", "schema_version", "source", "cluster"})
    name = type(fact).__name__
    deployment = getattr(fact, "deployment", None)
    return Event(
        id=str(fact.id),
        time=received_at,
        occurred_at=occurred_at(fact, received_at),
        type=name,
        object_kind="Deployment" if deployment else "Cluster",
        object_id=None if deployment else cluster.id,
        object_name=deployment or cluster.name,
        message=f"{cluster.name}: {name} {_summary(fact)}".strip(),
        data=data,
    )


def _summary(fact: Fact) -> str:
    if isinstance(fact, ReplicaStarted | ReplicaFailed):
        extra = f" ({fact.reason})" if isinstance(fact, ReplicaFailed) and fact.reason else ""
        return f"replica {fact.replica.replica_id} of {fact.replica.deployment}{extra}"
    if isinstance(fact, DesiredStateApplied):
        return f"generation {fact.generation}"
    if isinstance(fact, ReplicasScaled):
        return (
            f"{fact.deployment} {fact.from_replicas} → {fact.to_replicas} replicas: {fact.reason}"
        )
    return ", ".join(
        f"{k}={v}"
        for k, v in fact.model_dump(mode="json").items()
        if k in ("instance_id", "deployment", "pool", "reason", "deadline") and v
    )
