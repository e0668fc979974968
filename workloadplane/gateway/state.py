"""What one gateway holds: the routing table (persisted), each plane's signals, and the
gateway's own bookkeeping of each plane (upstream pool, ejection, RTT, requests there now).

``GatewayState`` is fed by the bus (``apply_table``, ``apply_load``: bounded, checked,
newest table wins, a forged or oversized message is dropped and counted), by the prober and
the dispatcher (``failed``, ``probe_ok``); ``choose`` hands the pure ``choice.rank`` a
snapshot of all of it. Time comes from the injected clock only.

``RoutesStore`` keeps the last accepted table on disk (framed with a CRC like the agent's
desired-state slots, written to a temporary file and renamed into place), so a gateway
restarted while NATS is unreachable routes from it at once (static stability).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram

from controlplane.contracts import (
    DeploymentLoad,
    DeploymentRoute,
    PlaneLoad,
    RegionPoint,
    RejectedMessageError,
    RoutingTable,
    cluster_from_subject,
    decode_plane_load,
    decode_routing_table,
)
from workloadplane.gateway.choice import Choice, ChoiceParams, Context, PlaneSignals, rank
from workloadplane.health import ReplicaHealth
from workloadplane.router.metrics import drop_series
from workloadplane.router.upstream import Abort, UpstreamPool, host_port
from workloadplane.state import frame, unframe

log = logging.getLogger(__name__)

Clock = Callable[[], float]
ROUTES_FILE = "routing-table"
_MAX_CHOICES = 1024
STORED_RESET_READS = 3
"""Reads of the bucket in a row (one per resync, 10 s apart) that find an older table than
the one held before it is taken as the fleet's (``GatewayState.apply_table``)."""
_EDGE_S = 1e-6
"""Kept answers expire this much before a verdict's edge (float rounding at the edge)."""


class RoutesStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / ROUTES_FILE

    def load(self) -> RoutingTable | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        payload = unframe(data)
        if payload is None:
            log.warning("ignoring torn %s", self.path)
            return None
        try:
            return decode_routing_table(payload)
        except RejectedMessageError as exc:
            log.error("ignoring unreadable %s (%s)", self.path, exc)
            return None

    def save(self, raw: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(frame(raw))
            while view:  # a short write (a full disk) would replace the file with a torn one
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


@dataclass(eq=False)
class Attempt:
    """One request's exchange with a plane: what ejecting the plane does to it."""

    deployment: str
    jurisdictions: frozenset[str] = frozenset()
    """The request's residency (where it may move)."""
    started: bool = False
    cancel: Abort | None = None
    cut: Abort | None = None
    alive_at: float | None = None
    """When its plane last showed it alive: the response head, then each chunk."""
    cut_here: bool = False
    """The gateway cut it (silent on a plane a probe found late): its connection held."""


@dataclass(eq=False)
class Plane:
    """The gateway's own view of one plane (one router endpoint, every deployment on it)."""

    cluster: str
    endpoint: str
    pool: UpstreamPool
    health: ReplicaHealth = field(default_factory=lambda: ReplicaHealth(readmit_after=2))
    healthy_since: float | None = None
    rtt_s: float | None = None
    load: PlaneLoad | None = None
    loads: dict[str, DeploymentLoad] = field(default_factory=dict)
    """``load``'s deployments by name (the last of a name), indexed once per report."""
    load_at: float | None = None
    attempts: set[Attempt] = field(default_factory=set)
    own_at_load: dict[str, int] = field(default_factory=dict)
    last_byte_at: float | None = None
    """When a stream from it last delivered bytes (the state's clock): a plane that is
    streaming to us is alive, whatever one late health probe says."""

    def own_count(self, deployment: str) -> int:
        """This gateway's requests for ``deployment`` on the plane now."""
        return sum(1 for a in self.attempts if a.deployment == deployment)

    def own_in_flight(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.attempts:
            out[a.deployment] = out.get(a.deployment, 0) + 1
        return out

    def signals(self) -> PlaneSignals:
        return PlaneSignals(
            cluster=self.cluster,
            ejected=self.health.ejected,
            ejected_reason=self.health.reason,
            healthy_since=self.healthy_since,
            rtt_s=self.rtt_s,
            load_at=self.load_at,
            loads=self.loads,
            own_in_flight=self.own_in_flight(),
            own_at_load=self.own_at_load,
        )


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gpufleet_gateway_requests",
            "Requests answered, by deployment, plane and status code",
            ["deployment", "plane", "code"],
            registry=r,
        )
        self.rejected = Counter(
            "gpufleet_gateway_rejected_messages",
            "Routing tables and load reports the gateway dropped, by kind and reason",
            ["kind", "reason"],
            registry=r,
        )
        self.failovers = Counter(
            "gpufleet_gateway_failovers",
            "Requests moved to another plane, by reason",
            ["reason"],
            registry=r,
        )
        self.ejections = Counter(
            "gpufleet_gateway_plane_ejections",
            "Planes taken out of rotation",
            ["plane"],
            registry=r,
        )
        sizes = tuple(float(4**k) for k in range(3, 13))  # 64 B … 16 MiB
        self.request_size = Histogram(
            "gpufleet_gateway_request_size_bytes",
            "Request bodies read, by deployment",
            ["deployment"],
            buckets=sizes,
            registry=r,
        )
        self.response_size = Histogram(
            "gpufleet_gateway_response_size_bytes",
            "Response bodies sent to the client, by deployment and plane",
            ["deployment", "plane"],
            buckets=sizes,
            registry=r,
        )
        times = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
        self.head_time = Histogram(
            "gpufleet_gateway_time_to_response_head_seconds",
            "From the request's arrival to the serving plane's response head (failovers "
            "before it included)",
            ["deployment", "plane"],
            buckets=times,
            registry=r,
        )
        self.duration = Histogram(
            "gpufleet_gateway_request_duration_seconds",
            "From the request's arrival to its last byte sent (mid-stream moves included)",
            ["deployment", "plane"],
            buckets=(*times, 120.0, 300.0),
            registry=r,
        )
        self._served: dict[tuple[str, str], Served] = {}
        self._answered: dict[tuple[str, str, int], Counter] = {}

    def served(self, deployment: str, plane: str) -> Served:
        """The labelled histograms of one (deployment, plane), looked up once: ``labels()``
        costs more than the observation, on every request (label values come from the
        routing table: bounded)."""
        key = (deployment, plane)
        served = self._served.get(key)
        if served is None:
            served = self._served[key] = Served(
                self.request_size.labels(deployment),
                self.response_size.labels(deployment, plane),
                self.head_time.labels(deployment, plane),
                self.duration.labels(deployment, plane),
            )
        return served

    def prune(self, deployments: set[str], planes: set[str]) -> None:
        """Drop the series of deployments and planes that left the routing table (a
        refusal's labels, "", stay)."""
        deployments, planes = deployments | {""}, planes | {""}
        d, dp = ("deployment",), ("deployment", "plane")
        labelled = [
            (self.requests, (*dp, "code")),
            (self.request_size, d),
            *((h, dp) for h in (self.response_size, self.head_time, self.duration)),
            (self.ejections, ("plane",)),
        ]
        drop_series(labelled, {"deployment": deployments, "plane": planes})
        for key in [k for k in self._served if k[0] not in deployments or k[1] not in planes]:
            del self._served[key]
        for key in [k for k in self._answered if k[0] not in deployments or k[1] not in planes]:
            del self._answered[key]

    def answered(self, deployment: str, plane: str, code: int) -> Counter:
        """``requests`` labelled for one answer (looked up once per label values)."""
        key = (deployment, plane, code)
        child = self._answered.get(key)
        if child is None:
            child = self._answered[key] = self.requests.labels(deployment, plane, str(code))
        return child


def _deployment_load(plane: Plane, deployment: str) -> tuple[object, ...] | None:
    """What ``rank`` reads of a plane's load report for ``deployment`` (not its sequence
    number, nor the TTFT it does not use)."""
    if plane.load is None:
        return None
    d = plane.loads.get(deployment)
    if d is None:
        return ()
    return d.ready_replicas, d.in_flight, d.queue_depth, d.capacity, d.service_rate


@dataclass(frozen=True, slots=True)
class Served:
    request_size: Histogram
    response_size: Histogram
    head_time: Histogram
    duration: Histogram


class GatewayState:
    def __init__(
        self,
        region: str,
        clock: Clock,
        store: RoutesStore | None = None,
        params: ChoiceParams | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.region = region
        self.clock = clock
        self.store = store
        self.params = params or ChoiceParams()
        self.metrics = metrics or GatewayMetrics()
        self.table: RoutingTable | None = None
        self.planes: dict[str, Plane] = {}
        self.routes: dict[str, DeploymentRoute] = {}
        self.regions: dict[str, RegionPoint] = {}
        self.last_report_at: float | None = None
        self.bus_connected = False
        self._older: tuple[tuple[int, int], int] | None = None
        """The older table the store holds, and how many reads in a row found it."""
        self._choices: dict[
            tuple[str, str | None, frozenset[str]],
            tuple[tuple[object, ...], float, float, Choice],
        ] = {}
        """Answers of ``rank`` kept: (inputs, from, until, answer) per request key."""

    # --- feeding --------------------------------------------------------------------------
    def restore(self) -> bool:
        """Route from the persisted table (before NATS answers); True if there was one."""
        table = self.store.load() if self.store is not None else None
        if table is None or _unreachable_endpoint(table) is not None:
            return False
        self._install(table)
        log.info("routing from the persisted table %s", table.version)
        return True

    def apply_table(self, data: bytes, *, stored: bool = False) -> bool:
        """A table from the bus: installed and persisted if valid and newer.

        ``stored``: read from the bucket (not a watch delivery), whose latest value only the
        control plane writes. An older table read there ``STORED_RESET_READS`` times in a row
        is installed: the control plane was rebuilt or restored with a new NATS store and
        numbers its tables from the start again, and it cannot know what this gateway holds
        (a gateway reports nothing), so waiting for a newer one would route from the old
        fleet for good. A late delivery of an old table is never read twice in a row there."""
        try:
            table = decode_routing_table(data)
        except RejectedMessageError as exc:
            self.metrics.rejected.labels("routing_table", exc.reason).inc()
            log.warning("rejected a routing table: %s", exc)
            return False
        if self.table is not None and table.version <= self.table.version:
            if table.version == self.table.version:
                self._older = None
                return False
            if stored:
                held = self._older
                reads = held[1] + 1 if held is not None and held[0] == table.version else 1
                self._older = (table.version, reads)
            if not stored or self._older is None or self._older[1] < STORED_RESET_READS:
                self.metrics.rejected.labels("routing_table", "older").inc()
                return False
            log.warning(
                "the control plane's routing table went back from %s to %s and stayed there "
                "%d reads: taking it (the control plane was rebuilt or restored)",
                self.table.version,
                table.version,
                STORED_RESET_READS,
            )
        self._older = None
        bad = _unreachable_endpoint(table)
        if bad is not None:  # refused whole: a half-installed table routed to no plane
            self.metrics.rejected.labels("routing_table", "bad_endpoint").inc()
            log.warning("rejected a routing table %s: %s", table.version, bad)
            return False
        self._install(table)
        if self.store is not None:
            try:
                self.store.save(data)
            except OSError as exc:  # routes on from memory; a restart without NATS has less
                log.error("cannot persist the routing table to %s: %s", self.store.path, exc)
        return True

    def _install(self, table: RoutingTable) -> None:
        """Routes from ``table`` (its endpoints checked by ``_unreachable_endpoint``)."""
        self.table = table
        self.routes = {d.name: d for d in table.deployments}
        self.regions = {r.name: r for r in table.regions}
        wanted: dict[str, str] = {}
        for d in table.deployments:
            for p in d.planes:
                wanted[p.cluster] = p.endpoint
        for cluster in [c for c in self.planes if c not in wanted]:
            self.planes.pop(cluster).pool.close()
        self.metrics.prune(set(self.routes), set(wanted))
        for cluster, endpoint in wanted.items():
            plane = self.planes.get(cluster)
            if plane is not None and plane.endpoint == endpoint:
                continue
            if plane is not None:
                plane.pool.close()
            host, port = host_port(endpoint)
            self.planes[cluster] = Plane(cluster, endpoint, UpstreamPool(host, port))

    def apply_load(self, subject: str, data: bytes) -> bool:
        """A plane's load report: kept if valid and sent by the plane it names (the last
        one to arrive wins: one publisher per plane, core NATS keeps its order)."""
        try:
            load = decode_plane_load(data)
        except RejectedMessageError as exc:
            self.metrics.rejected.labels("plane_load", exc.reason).inc()
            return False
        sender = cluster_from_subject(subject)
        if sender != load.cluster or load.source != f"cluster/{load.cluster}":
            self.metrics.rejected.labels("plane_load", "forged").inc()
            log.warning("rejected a load report for %s sent on %s", load.cluster, subject)
            return False
        now = self.clock()
        self.last_report_at = now
        plane = self.planes.get(load.cluster)
        if plane is None:
            return False
        plane.load, plane.load_at = load, now
        plane.loads = {d.name: d for d in load.deployments}
        plane.own_at_load = plane.own_in_flight()
        return True

    # --- the gateway's own outcomes -------------------------------------------------------
    def failed(self, cluster: str, reason: str, *, hung: bool = False) -> bool:
        """Take the plane out of rotation; its exchanges that got no byte are aborted (they
        go to the next plane); ``hung``: its streams silent for ``stream_stall_s`` are cut
        too (they continue elsewhere; the next late probe looks at the others again). True
        if this ejected it now."""
        plane = self.planes.get(cluster)
        if plane is None:
            return False
        if hung:
            now = self.clock()
            for a in list(plane.attempts):
                silent = a.alive_at is None or now - a.alive_at >= self.params.stream_stall_s
                if a.started and a.cut is not None and silent and self._elsewhere(a, cluster):
                    a.cut_here = True
                    a.cut(f"plane {cluster} stopped answering: {reason}")
        ejected = plane.health.failed(self.clock(), reason)
        if ejected:
            log.warning("plane %s out of rotation: %s", cluster, reason)
            self.metrics.ejections.labels(cluster).inc()
            why = f"plane {cluster} out of rotation: {reason}"
        elif hung and plane.health.ejected:  # out already, and still hung: a try made
            # anyway (no plane in rotation) would wait for a head until its client left
            why = f"plane {cluster} stopped answering: {reason}"
        else:
            return False
        for a in list(plane.attempts):
            if not a.started and a.cancel is not None:
                a.cancel(why)
        return ejected

    def _elsewhere(self, attempt: Attempt, cluster: str) -> bool:
        """Another plane in rotation may take ``attempt`` now. If none may, cutting it would
        only move it back to ``cluster`` once that is back: a stalled connection that
        resumes by itself is the better bet, and the stream keeps its moves."""
        choice = self.choose(attempt.deployment, None, attempt.jurisdictions)
        if choice is None or choice.last_resort:
            return False
        return any(r.cluster != cluster for r in choice.ranked)

    def probe_failed(self, cluster: str, reason: str, began: float) -> bool:
        """A health probe sent at ``began`` failed or came late: the plane is out of
        rotation and its silent streams are cut (``failed(hung=True)``) — unless a stream from it
        delivered bytes since the probe was sent: then its router is alive but slow to
        answer /health (a loaded machine), and cutting streams that flow would lose work.
        The next probe decides. True if this ejected it."""
        plane = self.planes.get(cluster)
        if plane is None:
            return False
        if plane.last_byte_at is not None and plane.last_byte_at >= began:
            log.info("plane %s: %s, but it is streaming: kept in rotation", cluster, reason)
            return False
        return self.failed(cluster, reason, hung=True)

    def probe_ok(self, cluster: str, rtt_s: float) -> None:
        plane = self.planes.get(cluster)
        if plane is None:
            return
        plane.rtt_s = rtt_s if plane.rtt_s is None else 0.7 * plane.rtt_s + 0.3 * rtt_s
        if plane.health.probe_ok():
            plane.healthy_since = self.clock()
            log.info("plane %s back in rotation (ramping up)", cluster)

    # --- the decision ---------------------------------------------------------------------
    def reports_flowing(self, now: float) -> bool:
        return (
            self.bus_connected
            and self.last_report_at is not None
            and now - self.last_report_at <= self.params.load_stale_s
        )

    def choose(
        self, deployment: str, client_region: str | None, jurisdictions: frozenset[str]
    ) -> Choice | None:
        """The ranking for one request (None: no such deployment in the table).

        ``rank`` is pure: its answer is reused while every input it reads is equal (the
        route, each of its planes' signals, this gateway's requests there, the client's
        region, the residency) and the clock has not reached a time at which one of its
        verdicts changes (a report going stale, a hold-down ending); never during a ramp,
        whose capacity moves with the clock."""
        route = self.routes.get(deployment)
        if route is None:
            return None
        now = self.clock()
        client = self.regions.get(client_region or self.region) or self.regions.get(self.region)
        key = (deployment, client.name if client is not None else None, jurisdictions)
        marks = self._marks(route, deployment, client, now)
        cached = self._choices.get(key)
        if cached is not None and cached[0] == marks and cached[1] <= now < cached[2]:
            return cached[3]
        ctx = Context(
            now=now,
            client=client,
            gateway_region=self.region,
            jurisdictions=jurisdictions,
            reports_flowing=self.reports_flowing(now),
        )
        signals = {c: p.signals() for c, p in self.planes.items()}
        choice = rank(route, signals, ctx, self.params)
        until = self._steady_until(route, now)
        if until > now:
            if len(self._choices) >= _MAX_CHOICES and key not in self._choices:
                self._choices.clear()  # keys come from request headers: bounded
            self._choices[key] = (marks, now, until, choice)
        return choice

    def _marks(
        self, route: DeploymentRoute, deployment: str, client: RegionPoint | None, now: float
    ) -> tuple[object, ...]:
        """Everything ``rank`` reads for ``route`` but the clock, compared by equality."""
        marks: list[object] = [route, client, self.region, self.params, self.reports_flowing(now)]
        planes = self.planes
        for p in route.planes:
            plane = planes.get(p.cluster)
            if plane is None:
                marks.append(None)
                continue
            health = plane.health
            marks += (
                plane,
                health.ejected,
                health.reason,
                plane.healthy_since,
                plane.rtt_s,
                plane.load_at is None,  # its age counts through _steady_until's edges
                _deployment_load(plane, deployment),
                plane.own_at_load.get(deployment, 0),
                plane.own_count(deployment) if plane.attempts else 0,
            )
        return tuple(marks)

    def _steady_until(self, route: DeploymentRoute, now: float) -> float:
        """Until when (exclusive) ``rank``'s answer for ``route`` stays what it is ``now``
        if no input changes; ``now``: it moves with the clock (not kept)."""
        stale = self.params.load_stale_s
        until = math.inf
        flowing = self.reports_flowing(now)
        if flowing:
            assert self.last_report_at is not None
            until = self.last_report_at + stale  # reports stop flowing past it
        for p in route.planes:
            plane = self.planes.get(p.cluster)
            if plane is None:
                continue
            if flowing and plane.load_at is not None:  # else report age is not held against it
                edge = plane.load_at + stale
                if now >= edge:
                    return now  # its exclusion names the report's age, which grows
                until = min(until, edge)
            if plane.healthy_since is not None:
                if now < plane.healthy_since + self.params.ramp_s:
                    return now  # ramping: its capacity grows with the clock
                edge = plane.healthy_since + route.hold_down_seconds
                if now < edge:
                    until = min(until, edge)
        return until - _EDGE_S

    def close(self) -> None:
        for plane in self.planes.values():
            plane.pool.close()


def _unreachable_endpoint(table: RoutingTable) -> str | None:
    """Why a plane of ``table`` cannot be dialled (None: every one can)."""
    for d in table.deployments:
        for p in d.planes:
            try:
                host_port(p.endpoint)
            except ValueError as exc:
                return f"plane {p.cluster}'s endpoint {p.endpoint[:200]!r}: {exc}"
    return None
