"""The gateways' routing table, built from plain data: which planes serve which deployment.

Pure: no I/O, no clock (``controlplane.services.routes`` loads the rows and numbers the
table). Rules:

- A plane is listed for a deployment when its cluster carries replicas of it — placed ones,
  or ready ones on its draining instances that keep serving until their replacements are
  ready (``hold_leaving`` in its desired state) — with that count, whatever the control
  plane thinks of the cluster's health (healthy, stale, cordoned, down): the gateways judge
  liveness themselves, from their own requests and the planes' load reports, and a plane the
  control plane wrongly thinks dead keeps serving. Placement moves replicas off a dead
  cluster; the plane leaves the table when it carries none.
- A cluster without an ``endpoint`` (no router URL) cannot be reached: it is left out and
  named in ``RouteBook.unreachable``.
- A plane outside the deployment's residency is never listed (placement never puts one
  there; this is the second lock on that door) and is named in ``RouteBook.outside``.
- ``jurisdictions``: the deployment's residency, from ``allowed_jurisdictions`` and the
  jurisdictions of its ``allowed_regions`` (both set: those of the allowed regions that are
  in the allowed jurisdictions). Empty: anywhere.
- ``active_passive``: the standby cluster's plane is ``role: standby``; every other plane
  is ``active``.
- Everything is sorted, so that the same fleet gives the same table and the same digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controlplane.contracts import DeploymentRoute, PlaneRoute, RegionPoint
from controlplane.specs import FailoverSpec, PlacementSpec


@dataclass(frozen=True)
class Site:
    """A region as the table needs it."""

    name: str
    jurisdiction: str
    latitude: float
    longitude: float
    provider: str = ""


@dataclass(frozen=True)
class Plane:
    """A cluster as the table needs it: where it is and how to reach its router."""

    cluster: str
    region: str
    endpoint: str | None


@dataclass(frozen=True)
class Served:
    """A deployment and how many replicas each cluster carries: ``replicas`` placed there,
    ``leaving`` ready on its draining instances (still serving while they move)."""

    name: str
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    failover: FailoverSpec = field(default_factory=FailoverSpec)
    replicas: Mapping[str, int] = field(default_factory=dict)
    leaving: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteBook:
    """The table's content, and what was left out of it (for the publisher's log)."""

    deployments: tuple[DeploymentRoute, ...]
    regions: tuple[RegionPoint, ...]
    unreachable: tuple[tuple[str, str], ...] = ()
    """(deployment, cluster): carries replicas but has no endpoint."""
    outside: tuple[tuple[str, str], ...] = ()
    """(deployment, cluster): a plane outside the deployment's residency."""

    def digest(self) -> str:
        """What the table says, hashed: the generation moves only when this does."""
        body = {
            "deployments": [d.model_dump(mode="json") for d in self.deployments],
            "regions": [r.model_dump(mode="json") for r in self.regions],
        }
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def residency(placement: PlacementSpec, sites: Mapping[str, Site]) -> list[str]:
    """The jurisdictions a deployment may be served in; empty: anywhere."""
    allowed = set(placement.allowed_jurisdictions)
    if not placement.allowed_regions:
        return sorted(allowed)
    of_regions = {sites[r].jurisdiction for r in placement.allowed_regions if r in sites}
    if not allowed:
        return sorted(of_regions)
    # both set: placement honours both; if they share nothing, nothing can be placed and the
    # explicit jurisdictions (never "anywhere") stand
    return sorted(allowed & of_regions or allowed)


def build_routes(
    served: Iterable[Served], planes: Iterable[Plane], sites: Iterable[Site]
) -> RouteBook:
    """The routing table's content for ``served`` on ``planes`` (see the module's rules)."""
    by_site = {s.name: s for s in sites}
    by_cluster = {p.cluster: p for p in planes}
    routes: list[DeploymentRoute] = []
    unreachable: list[tuple[str, str]] = []
    outside: list[tuple[str, str]] = []
    for dep in sorted(served, key=lambda d: d.name):
        jurisdictions = residency(dep.placement, by_site)
        listed: list[PlaneRoute] = []
        for cluster in sorted(dep.replicas.keys() | dep.leaving.keys()):
            replicas = dep.replicas.get(cluster, 0) + dep.leaving.get(cluster, 0)
            plane = by_cluster.get(cluster)
            if replicas <= 0 or plane is None or plane.region not in by_site:
                continue
            if not plane.endpoint:
                unreachable.append((dep.name, cluster))
                continue
            site = by_site[plane.region]
            if jurisdictions and site.jurisdiction not in jurisdictions:
                outside.append((dep.name, cluster))
                continue
            listed.append(
                PlaneRoute(
                    cluster=cluster,
                    endpoint=plane.endpoint.rstrip("/"),
                    region=site.name,
                    provider=site.provider,
                    jurisdiction=site.jurisdiction,
                    latitude=site.latitude,
                    longitude=site.longitude,
                    role="standby" if cluster == dep.failover.standby else "active",
                    replicas=replicas,
                )
            )
        routes.append(
            DeploymentRoute(
                name=dep.name,
                failover=dep.failover.mode.value,
                hold_down_seconds=dep.failover.hold_down_seconds,
                jurisdictions=jurisdictions,
                planes=listed,
            )
        )
    regions = tuple(
        RegionPoint(
            name=s.name, latitude=s.latitude, longitude=s.longitude, jurisdiction=s.jurisdiction
        )
        for s in sorted(by_site.values(), key=lambda s: s.name)
    )
    return RouteBook(tuple(routes), regions, tuple(unreachable), tuple(outside))
