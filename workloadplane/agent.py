"""Workload-plane agent (``gpufleet agent --cluster NAME``, built in ``workloadplane/cli.py``).

Holds the bus, the on-disk desired state, the pure reconcile, a Runtime and (with a router)
the local autoscaler, each passed in or built in the constructor. Loops: reconcile (on every
newer desired generation, every replica change and every ``reconcile_interval``), heartbeat
(every ``heartbeat_interval``), autoscale (every ``autoscale_interval`` and at once when a
request waits for a deployment at zero). NATS or the control plane being unreachable never
stops it: it keeps reconciling against the last snapshot it persisted (static stability).
A deployment a newer snapshot drops while it has traffic here keeps serving for
``disappearance_grace`` (``reconcile.keep_dropped``) unless the snapshot retires it; the
agent reports each such decision as a ``DeploymentKept`` fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from pathlib import Path

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from controlplane.contracts import (
    MAX_REPORT_ENTRIES,
    CapacityExhausted,
    DeploymentDesired,
    DeploymentKept,
    DeploymentObserved,
    DesiredState,
    DesiredStateApplied,
    Envelope,
    FreeCapacity,
    NatsCredentials,
    ObservedState,
    ReplicaFailed,
    ReplicasScaled,
    ReplicaStarted,
    ReplicaState,
    ReplicaStatus,
    cluster_inbox_prefix,
    cluster_user,
    utcnow,
)
from workloadplane.autoscaler_loop import Autoscaler
from workloadplane.autoscaling import Decision, ScaleAction
from workloadplane.bus import AgentBus
from workloadplane.capacity import free_capacity
from workloadplane.natsconnect import read_credentials
from workloadplane.reconcile import (
    DEFAULT_DISAPPEARANCE_GRACE,
    DEFAULT_DRAIN_LEAD,
    DrainReplica,
    Kept,
    StartReplica,
    StopReplica,
    keep_dropped,
    lane_adoptions,
    leaving_replicas,
    reconcile,
    replica_transitions,
    target_replicas,
    with_kept,
)
from workloadplane.router.core import Router
from workloadplane.runtime.base import GpuInventory, Runtime
from workloadplane.runtime.gpus import InsufficientGpusError
from workloadplane.state import DesiredStateStore, save_kept, should_apply

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"

RECONCILE_SECONDS = Histogram(
    "gpufleet_agent_reconcile_duration_seconds",
    "One reconcile pass: list the replicas, carry out the actions, acknowledge the generation",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RECONCILE_FAILURES = Counter(
    "gpufleet_agent_reconcile_failures_total", "Reconcile passes that raised (retried)"
)
REPLICAS = Gauge(
    "gpufleet_agent_replicas",
    "Replicas the agent's runtime lists, by deployment and state",
    ["deployment", "state"],
)
HEARTBEAT_SENT = Gauge(
    "gpufleet_agent_heartbeat_timestamp_seconds",
    "When the agent last published a heartbeat (Unix time; its age: time() - this)",
)
APPLIED_GENERATION = Gauge(
    "gpufleet_agent_applied_generation",
    "The desired-state generation the agent last applied (the control plane's, per epoch)",
)


class _ReplicaCounts:
    """``gpufleet_agent_replicas`` from each listing; a (deployment, state) that emptied is
    removed, so a deleted deployment does not linger."""

    def __init__(self) -> None:
        self.shown: set[tuple[str, str]] = set()

    def update(self, replicas: list[ReplicaStatus]) -> None:
        counts: dict[tuple[str, str], int] = {}
        for r in replicas:
            counts[(r.deployment, r.state)] = counts.get((r.deployment, r.state), 0) + 1
        for key in self.shown - counts.keys():
            REPLICAS.remove(*key)
        for key, n in counts.items():
            REPLICAS.labels(*key).set(n)
        self.shown = set(counts)


Clock = Callable[[], datetime]


class ReplicaChanges:
    """What the plane does when a runtime reports a replica change (a ``ReplicaWatcher``):
    the router follows at once (a draining replica gets no new request) and the agent's
    reconcile loop wakes. Built before the runtime and the agent and given to both, so that
    neither is wired to the other after construction. ``wake`` is the agent's wake-up (also
    set by a newer desired state and by autoscaling decisions)."""

    def __init__(self, router: Router | None = None) -> None:
        self.router = router
        self.wake = asyncio.Event()

    def replicas_changed(self, replicas: list[ReplicaStatus]) -> None:
        if self.router is not None:
            self.router.set_replicas(replicas)
        self.wake.set()


class Agent:
    """State and decisions of one cluster's agent; the runtime, store and router are
    injected. ``changes``: what the runtime reports to (built from ``router`` if omitted,
    for runtimes that report nothing). ``gpus``: the runtime's GPUs, reported upward in each
    heartbeat (without one the plane reports no capacity and placement trusts its inventory)."""

    def __init__(
        self,
        cluster: str,
        runtime: Runtime,
        store: DesiredStateStore,
        *,
        clock: Clock = utcnow,
        router: Router | None = None,
        changes: ReplicaChanges | None = None,
        drain_lead: timedelta = DEFAULT_DRAIN_LEAD,
        disappearance_grace: timedelta = DEFAULT_DISAPPEARANCE_GRACE,
        gpus: GpuInventory | None = None,
        steady: Callable[[], float] | None = None,
    ) -> None:
        if changes is not None and changes.router is not router:
            raise ValueError("changes must follow the agent's own router: ReplicaChanges(router)")
        self.cluster = cluster
        self.drain_lead = drain_lead
        """How long before a draining instance's deadline its replicas drain, ready
        replacement or not (the longest request should finish within it)."""
        self.disappearance_grace = disappearance_grace
        """How long a deployment a snapshot dropped keeps serving while it has traffic here
        (not when the snapshot lists it in ``retired``)."""
        self.router = router
        """The plane's request router, fed here with deployments and replicas (optional)."""
        self.runtime = runtime
        self.gpus = gpus
        self.store = store
        self.clock = clock
        self.desired: DesiredState | None = store.load(cluster)
        self.applied_generation = 0
        self.applied_epoch = 0
        """The epoch of ``applied_generation`` (acknowledged and reported with it)."""
        self.kept: dict[str, Kept] = {}
        self._kept_saved = False
        """Deployments a snapshot dropped that are still served (their grace period)."""
        self.last_traffic: dict[str, datetime] = {}
        """When each served deployment last had a request in flight or queued here."""
        self._served: list[DeploymentDesired] = (
            list(self.desired.deployments) if self.desired else []
        )
        self.wanted: dict[str, int] = {}
        """Replica counts the local autoscaler wants, per deployment (reconcile clamps them
        into the quota)."""
        self.autoscaler = Autoscaler(router, clock, steady=steady) if router is not None else None
        """Runs with a router only: without one there is no load to scale on."""
        self.bus: AgentBus | None = None
        self._known: dict[str, ReplicaState] | None = None
        self._trimmed = 0  # the desired entries last warned about (a heartbeat carries fewer)
        self._lock = asyncio.Lock()
        self._act_lock = asyncio.Lock()
        """Held from listing replicas to acting on them (reconcile, autoscale): neither acts
        on a list the other has just made stale."""
        self._failing: dict[tuple[str, str], str] = {}
        """Actions failing pass after pass: (kind, deployment or replica) → how, logged once."""
        self._wake = (changes or ReplicaChanges(router)).wake
        self._sync_task: asyncio.Task[None] | None = None
        self._unsynced = False
        self._counts = _ReplicaCounts()
        if self.desired is not None:
            log.info("loaded desired generation %s from disk", self.desired.generation)
            self._wake.set()

    @property
    def source(self) -> str:
        return f"cluster/{self.cluster}"

    def _emit(self, fact: Envelope) -> None:
        if self.bus is not None:
            self.bus.publish_fact(fact)

    async def on_desired(self, state: DesiredState, raw: bytes | None = None) -> None:
        """Accept a snapshot if it is newer; persist it before acting on it. ``raw``: the
        bytes it was decoded from, saved as they are (no re-encoding on the hot path)."""
        async with self._lock:
            if not should_apply(self.desired, state, self.cluster):
                return
            self.store.save(state, raw)
            self.desired = state
            self._unsynced = True  # synced after the reconcile pass it wakes
        self._wake.set()

    def _schedule_sync(self) -> None:
        """fsync in a thread, off the propagation path, coalescing bursts of snapshots.
        Started after the reconcile pass that acts on the snapshot, so that handing the work
        to a thread does not sit between the snapshot and its acknowledgement.

        The write already happened, so an agent crash cannot lose the snapshot; only a
        power loss within the next few ms could — and it takes the replicas with it, and the
        control plane re-sends the newest generation on reconnect."""
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.create_task(self._sync_until_clean())

    async def _sync_until_clean(self) -> None:
        while self._unsynced:
            self._unsynced = False
            try:
                await asyncio.to_thread(self.store.sync)
            except OSError:
                log.exception("fsync of the desired-state file failed")

    async def reconcile_once(self) -> None:
        """List replicas, carry out reconcile's actions, acknowledge the generation, report
        replicas' transitions (after the acknowledgement: it is what the control plane
        waits for, and it should not queue behind facts about earlier changes)."""
        async with self._lock:
            desired = self.desired
        async with self._act_lock:
            replicas = await self.runtime.list_replicas()
            self._counts.update(replicas)
            transitions = self._transitions(replicas)
            try:
                await self._act(desired, replicas)
            except BaseException:
                for fact in transitions:  # noted as known: they must go out all the same
                    self._emit(fact)
                raise
        if desired is not None and desired.version > (self.applied_epoch, self.applied_generation):
            self.applied_epoch, self.applied_generation = desired.version
            APPLIED_GENERATION.set(desired.generation)
            self._emit(
                DesiredStateApplied(
                    cluster=self.cluster,
                    source=self.source,
                    time=self.clock(),
                    generation=desired.generation,
                    epoch=desired.epoch,
                )
            )
        for fact in transitions:
            self._emit(fact)

    async def _act(self, desired: DesiredState | None, replicas: list[ReplicaStatus]) -> None:
        """Feed the router and carry out reconcile's actions (``_act_lock`` held)."""
        effective = self._effective(desired) if desired is not None else None
        if effective is not None and (adopted := lane_adoptions(effective, replicas)):
            for replica_id, deployment in adopted:
                log.info("replica %s of a promoted lane joins %s", replica_id, deployment)
                await self.runtime.adopt(replica_id, deployment)
            replicas = await self.runtime.list_replicas()
        if self.router is not None:
            if effective is not None:
                self.router.set_deployments(effective.deployments)
            self.router.set_replicas(replicas)
        if effective is not None:
            actions = reconcile(
                effective, replicas, self.wanted, now=self.clock(), drain_lead=self.drain_lead
            )
            await self._carry_out(actions)

    def _note_traffic(self, now: datetime) -> None:
        if self.router is None:
            return
        for d in self._served:
            in_flight, queued = self.router.load(d.name)
            if in_flight or queued:
                self.last_traffic[d.name] = now

    def _effective(self, desired: DesiredState) -> DesiredState:
        """``desired`` plus the deployments kept through their disappearance grace period;
        reports each newly kept one (a fact) and each one let go (a log line)."""
        now = self.clock()
        self._note_traffic(now)
        kept = keep_dropped(
            self._served, self.kept, desired, self.last_traffic, now, self.disappearance_grace
        )
        for name, k in sorted(kept.items()):
            if name not in self.kept:
                log.warning(
                    "deployment %s is not in desired generation %s:%s but had traffic here; "
                    "serving it until %s (disappearance grace)",
                    name,
                    desired.epoch,
                    desired.generation,
                    k.until.isoformat(),
                )
                self._emit(
                    DeploymentKept(
                        cluster=self.cluster,
                        source=self.source,
                        time=now,
                        deployment=name,
                        until=k.until,
                        reason="dropped by a newer snapshot while it had traffic here",
                    )
                )
        for name in sorted(set(self.kept) - set(kept)):
            log.info(
                "deployment %s: disappearance grace over (or placed/retired); letting go", name
            )
        if kept != self.kept or not self._kept_saved:  # the first: a file from before goes
            # the router in a process of its own reads the snapshot, not this memory
            save_kept(self.store.state_dir, [k.deployment for _, k in sorted(kept.items())])
            self._kept_saved = True
        self.kept = kept
        effective = with_kept(desired, kept)
        self._served = list(effective.deployments)
        names = {d.name for d in effective.deployments}
        self.last_traffic = {n: t for n, t in self.last_traffic.items() if n in names}
        return effective

    async def _carry_out(self, actions: list[StartReplica | StopReplica | DrainReplica]) -> None:
        """In order; a run of stops at once (each may wait out a grace period on a hung
        engine: 8 of them one after the other held the action lock two minutes)."""
        started = False
        stops: list[StopReplica] = []
        for action in [*actions, None]:
            if isinstance(action, StopReplica):
                stops.append(action)
                continue
            if stops:
                await asyncio.gather(*(self._do(stop) for stop in stops))
                stops = []
            if action is not None and await self._do(action):
                started = started or isinstance(action, StartReplica)
        if started and self.router is not None:
            # the router sees the starting replica at once: requests arriving now wait for
            # it instead of waking the autoscaler again
            self.router.set_replicas(await self.runtime.list_replicas())

    async def _do(self, action: StartReplica | StopReplica | DrainReplica) -> bool:
        """Carry out one action; False if it failed (logged, retried next pass)."""
        try:
            if isinstance(action, StartReplica):
                await self.runtime.start(
                    action.deployment,
                    action.spec,
                    pool=action.pool,
                    instance=action.instance,
                    serves=action.serves,
                )
            elif isinstance(action, DrainReplica):
                await self.runtime.drain(action.replica_id)
            else:
                await self.runtime.stop(action.replica_id)
        except Exception as exc:
            self._runtime_failed(action, exc)
            return False
        self._failing.pop(_subject(action), None)
        return True

    def _runtime_failed(
        self, action: StartReplica | StopReplica | DrainReplica, exc: Exception
    ) -> None:
        """Log a failed action once while it keeps failing the same way (it is retried every
        pass): a start short of GPUs, say, is a state, not news every two seconds."""
        subject, why = _subject(action), f"{type(exc).__name__}: {exc}"
        if self._failing.get(subject) == why:
            return
        if len(self._failing) >= 1024:
            self._failing.clear()
        self._failing[subject] = why
        what = f"{type(action).__name__} {subject[1]}"
        if isinstance(exc, InsufficientGpusError):
            log.warning("%s waits: %s; retrying every pass", what, exc)
        else:
            log.error("runtime failed on %s; retrying every pass", what, exc_info=exc)

    async def autoscale_once(self, only: Collection[str] | None = None) -> None:
        """Run the policy for each desired deployment (or those in ``only``) and carry the
        decisions out: drain the replicas a scale-down names, then set ``wanted``."""
        if self.autoscaler is None or self.desired is None:
            return
        desired = with_kept(self.desired, self.kept)
        changed = False
        async with self._act_lock:
            replicas = await self.runtime.list_replicas()
            now = self.clock()
            self._note_traffic(now)
            names = {d.name for d in desired.deployments}
            leaving = leaving_replicas(desired, replicas)
            self.autoscaler.forget(names, {r.replica_id for r in replicas})
            self.wanted = {n: w for n, w in self.wanted.items() if n in names}
            for d in desired.deployments:
                if only is not None and d.name not in only:
                    continue
                decision = self.autoscaler.decide(d, replicas, now, leaving)
                if decision is not None:
                    changed |= await self._apply_decision(d.name, decision)
        if changed:
            self._wake.set()  # reconcile starts the replicas now

    async def _apply_decision(self, name: str, decision: Decision) -> bool:
        """Drains first, then ``wanted``: reconcile then finds the count already right and
        removes no other replica. True when ``wanted`` changed."""
        if decision.action is ScaleAction.SCALE_DOWN:
            for replica_id in decision.drain:
                try:
                    await self.runtime.drain(replica_id)  # a starting one is stopped
                except Exception:
                    log.exception("draining %s failed; reconcile retries", replica_id)
        # HOLD while failed starts back off: start nothing until the backoff ends
        wanted = (
            decision.current_replicas
            if decision.action is ScaleAction.HOLD
            else decision.desired_replicas
        )
        before, self.wanted[name] = self.wanted.get(name), wanted
        if before is not None and before != wanted:  # an event upstream, not only a log line
            self._emit(
                ReplicasScaled(
                    cluster=self.cluster,
                    source=self.source,
                    time=self.clock(),
                    deployment=name,
                    from_replicas=before,
                    to_replicas=wanted,
                    reason=decision.reason,
                    panic=decision.panic,
                )
            )
        assert self.autoscaler is not None
        if self.autoscaler.newly_beyond_max(name):
            self._emit(
                CapacityExhausted(
                    cluster=self.cluster,
                    source=self.source,
                    time=self.clock(),
                    deployment=name,
                    wanted=decision.unconstrained_desired,
                    reason=f"autoscaler: {decision.reason}",
                )
            )
        return before != wanted

    async def autoscale_loop(self, interval: float = 1.0) -> None:
        """Decide every ``interval`` seconds and at once for a deployment the router woke."""
        if self.autoscaler is not None:
            await self.autoscaler.run(interval, self.autoscale_once)

    def _transitions(self, replicas: list[ReplicaStatus]) -> list[Envelope]:
        """Facts for the replicas that became ready or failed since the last listing."""
        facts: list[Envelope] = []
        if self._known is not None:
            for kind, replica in replica_transitions(self._known, replicas):
                fact_type = ReplicaStarted if kind == "started" else ReplicaFailed
                facts.append(
                    fact_type(
                        cluster=self.cluster, source=self.source, time=self.clock(), replica=replica
                    )
                )
        self._known = {r.replica_id: r.state for r in replicas}
        return facts

    async def observed_state(self) -> ObservedState:
        replicas = await self.runtime.list_replicas()
        deployments = []
        if self.desired is not None:
            for d in self.desired.deployments:
                demand = self.autoscaler.demand(d.name) if self.autoscaler else None
                if demand is None:
                    wish = self.wanted.get(d.name)
                    demand = wish if wish is not None else target_replicas(d, None)
                in_flight, queued = self.router.load(d.name) if self.router else (0, 0)
                deployments.append(
                    DeploymentObserved(
                        name=d.name,
                        demand=demand,
                        in_flight=in_flight,
                        queue_depth=queued,
                        usage=self.router.usage(d.name) if self.router else None,
                        outcomes=self.router.outcomes(d.name) if self.router else None,
                    )
                )
        if len(deployments) > MAX_REPORT_ENTRIES and self.desired is not None:
            lanes = {d.name for d in self.desired.deployments if d.serves and d.serves != d.name}
            deployments = reportable(deployments, lanes)
            if self._trimmed != len(self.desired.deployments):
                log.warning(
                    "the desired state names %d deployments; a heartbeat reports at most %d "
                    "(those with traffic or demand first): the others' demand is not reported",
                    len(self.desired.deployments),
                    MAX_REPORT_ENTRIES,
                )
            self._trimmed = len(self.desired.deployments)
        return ObservedState(
            cluster=self.cluster,
            source=self.source,
            time=self.clock(),
            observed_generation=self.applied_generation,
            observed_epoch=self.applied_epoch,
            agent_version=AGENT_VERSION,
            replicas=replicas,
            deployments=deployments,
            free_capacity=self._free_capacity_or_none(replicas),
        )

    def _free_capacity_or_none(self, replicas: list[ReplicaStatus]) -> list[FreeCapacity]:
        """``free_capacity``, or none when working it out fails: a bug there (it runs
        reconcile) must not stop the heartbeat, or the control plane takes a plane that
        serves for dead."""
        try:
            return self.free_capacity(replicas)
        except Exception:
            log.exception("working out free capacity failed; the heartbeat goes without it")
            return []

    def free_capacity(self, replicas: list[ReplicaStatus]) -> list[FreeCapacity]:
        """Per pool, the GPUs this plane can use, the free ones and the replicas that cannot
        start for lack of them (what reconcile would start now beyond the free GPUs)."""
        if self.gpus is None:
            return []
        actions = (
            reconcile(self.desired, replicas, self.wanted, now=self.clock())
            if self.desired is not None
            else []
        )
        starts = [a for a in actions if isinstance(a, StartReplica)]
        total, free = self.gpus.gpu_capacity()
        return free_capacity(self.desired, replicas, starts, total, free)

    async def reconcile_loop(self, interval: float) -> None:
        while True:
            # asyncio.timeout, not wait_for: no extra task per wait, so a wake-up reaches
            # reconcile in one hop (it is on the desired → applied path)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                with RECONCILE_SECONDS.time():
                    await self.reconcile_once()
            except Exception:
                RECONCILE_FAILURES.inc()
                log.exception("reconcile pass failed; retrying")
            if self._unsynced:
                self._schedule_sync()

    async def heartbeat_loop(self, interval: float) -> None:
        while True:
            if self.bus is not None:
                try:
                    if await self.bus.publish_heartbeat(await self.observed_state()):
                        HEARTBEAT_SENT.set_to_current_time()
                except Exception:
                    log.exception("building heartbeat failed")
            await asyncio.sleep(interval)


async def serve(
    agent: Agent,
    nats_url: str | list[str],
    credentials: NatsCredentials | None,
    *,
    heartbeat_interval: float = 5.0,
    reconcile_interval: float = 2.0,
    resync_interval: float = 30.0,
    stop: asyncio.Event | None = None,
    router_address: tuple[str, int] | None = None,
    autoscale_interval: float = 1.0,
) -> None:
    """Connect ``agent`` to the bus and run its loops until ``stop`` is set (forever if None);
    with ``router_address`` (and ``agent.router``) also serve the plane's router there."""
    bus = AgentBus(
        agent.cluster, nats_url, credentials, agent.on_desired, resync_interval=resync_interval
    )
    agent.bus = bus
    await bus.start()
    loops = [
        asyncio.create_task(agent.reconcile_loop(reconcile_interval), name="agent-reconcile"),
        asyncio.create_task(agent.heartbeat_loop(heartbeat_interval), name="agent-heartbeat"),
        asyncio.create_task(agent.autoscale_loop(autoscale_interval), name="agent-autoscale"),
    ]
    tasks = list(loops)
    router_stop = asyncio.Event()
    if agent.router is not None and router_address is not None:
        from workloadplane.router.server import serve_router

        host, port = router_address
        tasks.append(
            asyncio.create_task(
                # the agent's own metrics (rejected messages, publish failures) are in this
                # process's default registry: the router's /metrics serves them too
                serve_router(agent.router, host, port, router_stop, [REGISTRY]),
                name="agent-router",
            )
        )
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        router_stop.set()
        for task in loops:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await bus.close()
        agent.bus = None
        agent.store.close()  # (re-opened by the next save if the agent is served again)


async def run_agent(
    cluster: str,
    nats_url: str | list[str],
    credentials: NatsCredentials | None,
    state_dir: Path,
    runtime: Runtime,
    *,
    clock: Clock = utcnow,
    heartbeat_interval: float = 5.0,
    reconcile_interval: float = 2.0,
    resync_interval: float = 30.0,
    stop: asyncio.Event | None = None,
    fsync: bool = True,
    router: Router | None = None,
    changes: ReplicaChanges | None = None,
    router_address: tuple[str, int] | None = None,
    drain_lead: timedelta = DEFAULT_DRAIN_LEAD,
    disappearance_grace: timedelta = DEFAULT_DISAPPEARANCE_GRACE,
    gpus: GpuInventory | None = None,
) -> Agent:
    """Build the agent for ``cluster`` and serve until ``stop`` is set; returns the Agent.
    ``changes``: the ``ReplicaChanges`` the runtime was built with, if it reports any."""
    store = DesiredStateStore(state_dir, fsync=fsync)
    agent = Agent(
        cluster,
        runtime,
        store,
        clock=clock,
        router=router,
        changes=changes,
        drain_lead=drain_lead,
        disappearance_grace=disappearance_grace,
        gpus=gpus,
        steady=time.monotonic if clock is utcnow else None,  # an injected clock drives all
    )
    await serve(
        agent,
        nats_url,
        credentials,
        heartbeat_interval=heartbeat_interval,
        reconcile_interval=reconcile_interval,
        resync_interval=resync_interval,
        stop=stop,
        router_address=router_address,
    )
    return agent


def reportable(
    deployments: list[DeploymentObserved], lanes: set[str], most: int = MAX_REPORT_ENTRIES
) -> list[DeploymentObserved]:
    """At most ``most`` of the entries, in their order: a heartbeat carries no more, and a
    plane given more built one that failed to validate and sent none (the control plane
    took it for dead). Kept first: those with requests in flight or queued, then by demand;
    rollout lanes last (their demand counts for nothing upstream)."""
    if len(deployments) <= most:
        return deployments
    ranked = sorted(
        deployments,
        key=lambda d: (d.name in lanes, -(d.in_flight + d.queue_depth), -d.demand, d.name),
    )
    kept = {d.name for d in ranked[:most]}
    return [d for d in deployments if d.name in kept]


def _subject(action: StartReplica | StopReplica | DrainReplica) -> tuple[str, str]:
    name = action.deployment if isinstance(action, StartReplica) else action.replica_id
    return type(action).__name__, name


def load_credentials(cluster: str, path: str | None) -> NatsCredentials | None:
    """From a JSON file (``{"user":…, "password":…}``) or GPUFLEET_NATS_USER/PASSWORD."""
    if path:  # a bad file raises CredentialsFileError, naming what to change
        return read_credentials(Path(path), cluster_user(cluster), cluster_inbox_prefix(cluster))
    if os.environ.get("GPUFLEET_NATS_PASSWORD"):
        return NatsCredentials(
            user=os.environ.get("GPUFLEET_NATS_USER", cluster_user(cluster)),
            password=os.environ["GPUFLEET_NATS_PASSWORD"],
            inbox_prefix=cluster_inbox_prefix(cluster),
        )
    return None


if __name__ == "__main__":  # python -m workloadplane.agent … is gpufleet agent …
    # The CLI imports this module by name: let it find this run of it rather than executing
    # it a second time (its metrics would be registered twice and the import fail).
    sys.modules["workloadplane.agent"] = sys.modules[__name__]
    from workloadplane.cli import agent_main

    agent_main()
