"""Active-passive standby replicas as an input transformation of the placement engine.

The engine knows nothing of failover. For a deployment with ``failover.mode:
active_passive`` the engine's input gets a second, synthetic deployment ``<name>/standby``
('/' is never in a name): a fixed demand of ``standby_replicas`` (min = wanted), the
deployment's GPU shape, certifications, residency and priority, allowed only in the standby
cluster's region. The active part avoids that region when its rules leave it another one (a
standby is there for a region or cloud outage), so that the standby plane carries only the
standby. The result is folded back: the synthetic deployment's replicas become the real
deployment's replicas on the standby cluster, priced like any other, and the pure engine is
untouched. `standbys_of` reads what each deployment keeps warm from its rows; the rest is
plain data in, plain data out.

What it cannot express: another cluster in the standby's region that shares none of its
pools cannot carry the standby; replicas the engine put there are reported unplaced
(``constraint: standby_cluster``). If the deployment may run nowhere but the standby's
region, its active replicas may share the standby cluster (the gateways then treat that
plane as the standby).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from controlplane import placement as engine
from controlplane.db import models as m
from controlplane.db.columns import deployment_failover

SUFFIX = "/standby"


@dataclass(frozen=True)
class Standby:
    """What a deployment keeps warm: ``replicas`` on ``cluster`` (in ``region``, drawing on
    ``pools``)."""

    deployment: str
    cluster: str
    region: str
    pools: frozenset[str]
    replicas: int
    gpus_per_replica: int = 1

    @property
    def engine_name(self) -> str:
        return self.deployment + SUFFIX


def standbys_of(
    deployments: Mapping[str, m.Deployment], clusters: Mapping[str, m.Cluster]
) -> dict[str, Standby]:
    """The standby of every active_passive deployment whose standby cluster exists."""
    found: dict[str, Standby] = {}
    for name, row in deployments.items():
        failover = deployment_failover(row)
        cluster = clusters.get(failover.standby or "")
        if cluster is None:
            continue
        found[name] = Standby(
            deployment=name,
            cluster=cluster.name,
            region=cluster.region.name,
            pools=frozenset(p.name for p in cluster.pools),
            replicas=failover.standby_replicas,
            gpus_per_replica=row.gpus_per_replica,
        )
    return found


def _active(dep: engine.Deployment, standby: Standby, regions: frozenset[str]) -> engine.Deployment:
    allowed = dep.policy.allowed_regions or regions
    elsewhere = allowed - {standby.region}
    if not elsewhere:  # nowhere else to go: the active part may share the standby's region
        return dep
    return replace(dep, policy=replace(dep.policy, allowed_regions=frozenset(elsewhere)))


def _synthetic(dep: engine.Deployment, standby: Standby) -> engine.Deployment:
    return replace(
        dep,
        name=standby.engine_name,
        wanted_replicas=standby.replicas,
        min_replicas=standby.replicas,
        policy=replace(
            dep.policy,
            allowed_regions=frozenset({standby.region}),
            min_distinct_providers=1,
            min_distinct_regions=1,
        ),
        traffic={},
    )


def with_standbys(
    inp: engine.PlacementInput, standbys: Mapping[str, Standby]
) -> engine.PlacementInput:
    """The engine's input with each standby as a deployment of its own (see the module)."""
    if not standbys:
        return inp
    regions = frozenset(r.name for r in inp.regions)
    deployments: list[engine.Deployment] = []
    for dep in inp.deployments:
        standby = standbys.get(dep.name)
        if standby is None:
            deployments.append(dep)
            continue
        deployments += [_active(dep, standby, regions), _synthetic(dep, standby)]
    current = engine_current(inp.current, standbys)
    return replace(inp, deployments=tuple(deployments), current=current)


def engine_current(
    assignments: tuple[engine.Assignment, ...], standbys: Mapping[str, Standby]
) -> tuple[engine.Assignment, ...]:
    """Placed replicas as the engine sees them: those of a deployment on its standby cluster
    belong to ``<name>/standby`` (idempotent)."""
    return tuple(
        replace(a, deployment=standbys[a.deployment].engine_name)
        if is_standby(standbys, a.deployment, a.cluster)
        else a
        for a in assignments
    )


def fold_standbys(
    result: engine.PlacementResult, standbys: Mapping[str, Standby]
) -> engine.PlacementResult:
    """The engine's result with each synthetic standby folded into its deployment."""
    if not standbys:
        return result
    by_engine = {s.engine_name: s for s in standbys.values()}
    replicas: dict[tuple[str, str, str], int] = defaultdict(int)
    stray: dict[str, int] = defaultdict(int)
    for a in result.assignments:
        standby = by_engine.get(a.deployment)
        if standby is None:
            replicas[(a.deployment, a.cluster, a.pool)] += a.replicas
        elif a.pool in standby.pools:  # a shared pool: the standby cluster draws on it too
            replicas[(standby.deployment, standby.cluster, a.pool)] += a.replicas
        else:
            stray[standby.deployment] += a.replicas
    assignments = tuple(
        engine.Assignment(dep, cluster, pool, n)
        for (dep, cluster, pool), n in sorted(replicas.items())
        if n > 0
    )
    unplaced = [_unplaced(u, by_engine) for u in result.unplaced]
    for name, n in sorted(stray.items()):
        standby = standbys[name]
        unplaced.append(
            engine.Unplaced(
                deployment=name,
                replicas=n,
                gpus_per_replica=standby.gpus_per_replica,
                constraint="standby_cluster",
                reason=f"standby: only another cluster of region {standby.region} has room; "
                f"give cluster {standby.cluster} a pool with GPUs for it",
            )
        )
    cost: dict[str, float] = defaultdict(float)
    for name, value in result.cost_per_hour.items():
        cost[by_engine[name].deployment if name in by_engine else name] += value
    return replace(
        result,
        assignments=assignments,
        changes=tuple(
            replace(c, deployment=by_engine[c.deployment].deployment)
            if c.deployment in by_engine
            else c
            for c in result.changes
        ),
        unplaced=tuple(unplaced),
        cost_per_hour={name: round(value, 6) for name, value in cost.items()},
    )


def _unplaced(u: engine.Unplaced, by_engine: Mapping[str, Standby]) -> engine.Unplaced:
    standby = by_engine.get(u.deployment)
    if standby is None:
        return u
    return replace(
        u,
        deployment=standby.deployment,
        reason=f"standby on cluster {standby.cluster}: "
        + u.reason.replace(standby.engine_name, standby.deployment),
    )


def is_standby(standbys: Mapping[str, Standby], deployment: str, cluster: str) -> bool:
    standby = standbys.get(deployment)
    return standby is not None and standby.cluster == cluster
