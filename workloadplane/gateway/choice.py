"""The gateway's decision: which planes may serve a request, in which order. Pure.

``rank`` takes one deployment's route (from the routing table), what the gateway knows of
each of its planes (``PlaneSignals``: its own outcomes and probes, the measured RTT, the
plane's last load report), where the client is, the request's residency and the time, and
returns the planes to try in order, the ones left out and why. Rules, in order:

1. **Residency.** Allowed jurisdictions are the intersection of every restriction that is
   set (the deployment's ``jurisdictions``, the API key's, the ``x-gpufleet-jurisdiction``
   header). A plane outside them is never ranked, also when every allowed one is down: the
   answer is then a refusal naming the jurisdiction (the caller's 503), never a
   cross-border route.
2. **Health.** A plane the gateway ejected (connection error, no head in time, a failed
   probe) is out. So is a plane whose load reports stopped (older than ``load_stale_s``)
   while reports from the fleet are flowing; when none are (NATS or the gateway's bus is
   down) report age says nothing and only the gateway's own outcomes count (static
   stability). **Last resort** (Envoy's panic mode): when every plane the residency allows
   is out for health, they are ranked anyway, after nothing — a health verdict can be the
   gateway's own blind spot (a probe that came late on a loaded machine), and a plane that
   is really down fails fast (connection refused) or within the head timeout, which is no
   worse than the refusal the client would get. Planes out only for a stale report come
   before ejected ones.
3. **Active-passive.** A ``standby`` plane is ranked only when no ``active`` plane is
   usable. An active plane that came back is usable again once it has been healthy for the
   route's ``hold_down_seconds`` (no flapping); if every standby is down too, it is used at
   once.
4. **Least expected time to first token.** expected = network (the measured RTT to the
   plane when the client is in the gateway's region and one was measured, else 2 × 5 ms
   per time zone between the client's region and the plane's) + queue wait (requests ahead
   ÷ the plane's service rate) + a cold penalty (no ready replica). A **saturated** plane
   (in flight ≥ capacity) is ranked after every plane with headroom: spill over to the next
   plane rather than queue behind the nearest. A plane that recovered ramps its capacity
   from 10 % to 100 % over ``ramp_s``, so its traffic comes back gradually.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.contracts import DeploymentLoad, DeploymentRoute, PlaneRoute, RegionPoint


@dataclass(frozen=True, slots=True)
class ChoiceParams:
    one_way_per_zone_s: float = 0.005
    cold_penalty_s: float = 10.0
    """A plane with no ready replica (starting, or scaled to zero) — a cold start."""
    unknown_rate: float = 1.0
    """Service rate assumed (requests/s) when a plane reported none yet."""
    load_stale_s: float = 2.0
    """A plane's load report older than this (while others arrive) takes it out (≤ 3 s)."""
    ramp_s: float = 10.0
    ramp_floor: float = 0.1
    measured_rtt: bool = True
    """False: the time-zone model only (every plane on one machine: demos, tests)."""
    stream_stall_s: float = 1.0
    """A late probe cuts only the plane's exchanges silent this long (no head, no byte): one
    still in its prefill, or slowed by a loaded machine, is alive, not hung."""


@dataclass(frozen=True, slots=True)
class PlaneSignals:
    """What the gateway knows of one plane now (times on the gateway's clock)."""

    cluster: str
    ejected: bool = False
    ejected_reason: str = ""
    healthy_since: float | None = None
    """When it was readmitted after an ejection; None: never ejected since the start."""
    rtt_s: float | None = None
    load_at: float | None = None
    """When its last load report arrived (None: none yet)."""
    loads: Mapping[str, DeploymentLoad] = field(default_factory=dict)
    own_in_flight: Mapping[str, int] = field(default_factory=dict)
    """This gateway's requests there now, per deployment (fresher than any report)."""
    own_at_load: Mapping[str, int] = field(default_factory=dict)
    """This gateway's requests there when the last load report arrived."""


@dataclass(frozen=True, slots=True)
class Context:
    """The request's and the gateway's side of the decision."""

    now: float
    client: RegionPoint | None
    """Where the client is (its header, else the gateway's own region)."""
    gateway_region: str = ""
    jurisdictions: frozenset[str] = frozenset()
    """Restrictions from the key and the header, already intersected (empty: none)."""
    reports_flowing: bool = True
    """Load reports arrive from the fleet (else report age is not held against a plane)."""


@dataclass(frozen=True, slots=True)
class Ranked:
    cluster: str
    endpoint: str
    expected_s: float
    network_s: float
    queue_s: float
    cold_s: float
    saturated: bool
    role: str
    note: str = ""
    """What comes before the expected time in ``why`` (standby, spill-over, last resort)."""
    region: str = ""
    """The plane's region (an answer to a client elsewhere is data transfer)."""

    @property
    def why(self) -> str:
        """Why it ranks here: the ``x-gpufleet-route`` header when it serves (formatted on
        demand: only the plane that serves needs it)."""
        expected = (
            f"expected ttft {self.expected_s * 1000:.0f}ms = network {self.network_s * 1000:.0f}"
            f"ms + queue {self.queue_s * 1000:.0f}ms + cold {self.cold_s * 1000:.0f}ms"
        )
        return f"{self.note}; {expected}" if self.note else expected


@dataclass(frozen=True, slots=True)
class Choice:
    deployment: str
    ranked: tuple[Ranked, ...]
    excluded: tuple[tuple[str, str], ...]
    """(cluster, why) of each plane not ranked."""
    allowed: frozenset[str]
    """The allowed jurisdictions (empty: anywhere)."""
    refusal: str | None = None
    """Why nothing may serve (when ``ranked`` is empty, or holds only the last resort)."""
    last_resort: bool = False
    """``ranked`` holds planes out of rotation: every allowed one is (panic mode)."""
    client_region: str = ""
    """Where the client is, as ranked (its header's region, else the gateway's)."""


def zones_between(a_longitude: float, b_longitude: float) -> int:
    """Time zones crossed: |Δlongitude| / 15, the short way round, rounded."""
    delta = abs(a_longitude - b_longitude) % 360
    return round(min(delta, 360 - delta) / 15)


def allowed_jurisdictions(route: DeploymentRoute, asked: frozenset[str]) -> frozenset[str] | None:
    """The intersection of the deployment's residency and ``asked``; None: they conflict."""
    own = frozenset(j.upper() for j in route.jurisdictions)
    if own and asked:
        both = own & asked
        return both or None
    return own or asked


def rank(
    route: DeploymentRoute,
    signals: Mapping[str, PlaneSignals],
    ctx: Context,
    params: ChoiceParams = ChoiceParams(),
) -> Choice:
    allowed = allowed_jurisdictions(route, ctx.jurisdictions)
    if allowed is None:
        where = ", ".join(sorted(ctx.jurisdictions))
        own = ", ".join(route.jurisdictions)
        return Choice(
            route.name,
            (),
            (),
            frozenset(),
            f"deployment {route.name} may be served only in {own}, the request asks for {where}",
        )
    excluded: list[tuple[str, str]] = []
    healthy: list[tuple[PlaneRoute, PlaneSignals]] = []
    unhealthy: list[tuple[PlaneRoute, PlaneSignals]] = []
    for plane in route.planes:
        sig = signals.get(plane.cluster) or PlaneSignals(plane.cluster)
        if allowed and plane.jurisdiction.upper() not in allowed:
            why = f"jurisdiction {plane.jurisdiction} is not allowed ({', '.join(sorted(allowed))})"
            excluded.append((plane.cluster, why))
        elif why := _unhealthy_because(sig, ctx, params):
            excluded.append((plane.cluster, why))
            unhealthy.append((plane, sig))
        else:
            healthy.append((plane, sig))
    serving, note = _by_role(route, healthy, ctx, excluded)
    ranked = [_expect(plane, sig, route.name, ctx, params) for plane, sig in serving]
    ranked.sort(key=_by_expected)
    ranked = _explained(ranked, note)
    client = ctx.client.name if ctx.client is not None else ""
    if ranked:
        return Choice(route.name, tuple(ranked), tuple(excluded), allowed, client_region=client)
    where = f" in {', '.join(sorted(allowed))}" if allowed else ""
    reasons = "; ".join(f"{c}: {w}" for c, w in excluded) or "it has no planes"
    refusal = f"no healthy plane of deployment {route.name}{where} ({reasons})"
    last = [_expect(plane, sig, route.name, ctx, params) for plane, sig in unhealthy]
    ejected = {p.cluster for p, s in unhealthy if s.ejected}
    last.sort(key=lambda r: (r.cluster in ejected, r.saturated, r.expected_s, r.cluster))
    last = _explained(last, "last resort: every plane is out of rotation")
    return Choice(route.name, tuple(last), tuple(excluded), allowed, refusal, bool(last), client)


def _unhealthy_because(sig: PlaneSignals, ctx: Context, params: ChoiceParams) -> str:
    if sig.ejected:
        return f"ejected: {sig.ejected_reason}"
    if ctx.reports_flowing:
        if sig.load_at is None:
            return "no load report yet"
        age = ctx.now - sig.load_at
        if age > params.load_stale_s:
            return f"no load report for {age:.1f}s"
    return ""


def _by_role(
    route: DeploymentRoute,
    healthy: list[tuple[PlaneRoute, PlaneSignals]],
    ctx: Context,
    excluded: list[tuple[str, str]],
) -> tuple[list[tuple[PlaneRoute, PlaneSignals]], str]:
    if route.failover != "active_passive":
        return healthy, ""
    active = [(p, s) for p, s in healthy if p.role == "active"]
    standby = [(p, s) for p, s in healthy if p.role == "standby"]
    settled = [
        (p, s)
        for p, s in active
        if s.healthy_since is None or ctx.now - s.healthy_since >= route.hold_down_seconds
    ]
    if settled:
        names = {p.cluster for p, _ in settled}
        excluded += [(p.cluster, "standby: an active plane serves") for p, _ in standby]
        excluded += [
            (p.cluster, f"active, back for less than {route.hold_down_seconds:g}s (hold-down)")
            for p, _ in active
            if p.cluster not in names
        ]
        return settled, ""
    if standby:
        excluded += [
            (p.cluster, f"active, back for less than {route.hold_down_seconds:g}s (hold-down)")
            for p, _ in active
        ]
        return standby, "standby: no active plane can serve"
    return active, ""


def _expect(
    plane: PlaneRoute, sig: PlaneSignals, deployment: str, ctx: Context, params: ChoiceParams
) -> Ranked:
    client = ctx.client
    if (
        params.measured_rtt
        and sig.rtt_s is not None
        and (client is None or client.name == ctx.gateway_region)
    ):
        network = sig.rtt_s
    elif client is not None:
        network = 2 * params.one_way_per_zone_s * zones_between(client.longitude, plane.longitude)
    else:
        network = 0.0
    load = sig.loads.get(deployment)
    own = sig.own_in_flight.get(deployment, 0)
    queue, cold, saturated = 0.0, 0.0, False
    if load is not None:
        ramp = 1.0
        if sig.healthy_since is not None and params.ramp_s > 0:
            ramp = min(1.0, max(params.ramp_floor, (ctx.now - sig.healthy_since) / params.ramp_s))
        capacity = load.capacity * ramp
        in_flight = own + max(0, load.in_flight - sig.own_at_load.get(deployment, 0))
        if load.ready_replicas == 0:
            cold = params.cold_penalty_s
        saturated = in_flight >= capacity
        ahead = load.queue_depth + (in_flight + 1 - capacity if saturated else 0)
        # a report's rate of 1e-300 would make an infinite wait (and /debug/routes' JSON
        # invalid): at most a day's wait per request ahead
        rate = max(load.service_rate, 1 / 86400) if load.service_rate > 0 else params.unknown_rate
        queue = max(ahead, 0) / rate
    return Ranked(
        cluster=plane.cluster,
        endpoint=plane.endpoint,
        expected_s=network + queue + cold,
        network_s=network,
        queue_s=queue,
        cold_s=cold,
        saturated=saturated,
        role=plane.role,
        region=plane.region,
    )


def _by_expected(r: Ranked) -> tuple[bool, float, str]:
    return r.saturated, r.expected_s, r.cluster


def _explained(ranked: list[Ranked], note: str) -> list[Ranked]:
    """Each plane's ``note``, the first part of its ``why`` (the ``x-gpufleet-route`` header
    when it serves); most rankings have none to add."""
    if not ranked or (not note and not any(r.saturated for r in ranked)):
        return ranked
    out = []
    nearest = min(ranked, key=lambda r: r.network_s).cluster
    saturated = [r.cluster for r in ranked if r.saturated]
    for i, r in enumerate(ranked):
        parts = [note] if note else []
        if i == 0 and r.cluster != nearest and nearest in saturated:
            parts.append(f"spill-over: {nearest} is saturated")
        elif r.saturated:
            parts.append("saturated: every plane is")
        out.append(dataclasses.replace(r, note="; ".join(parts)) if parts else r)
    return out
