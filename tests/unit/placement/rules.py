"""The hard rules of docs/placement.md as one check over any placement input and result."""

from __future__ import annotations

import math

from controlplane.placement import PlacementInput, PlacementResult


def check_rules(inp: PlacementInput, result: PlacementResult) -> None:
    """Every hard rule of docs/placement.md, for any input."""
    pools = {p.id: p for p in inp.pools}
    deps = {d.name: d for d in inp.deployments}
    juris = {r.name: r.jurisdiction for r in inp.regions}
    healthy = {c.name: set(c.pool_ids) for c in inp.clusters if c.state == "healthy"}
    used: dict[str, int] = {}
    placed: dict[str, list[tuple[str, int]]] = {}
    for a in result.assignments:
        pool, dep = pools[a.pool], deps[a.deployment]
        pol = dep.policy
        used[a.pool] = used.get(a.pool, 0) + a.replicas * dep.gpus_per_replica
        placed.setdefault(a.deployment, []).append((a.pool, a.replicas))
        assert a.pool in healthy[a.cluster]
        assert pool.gpu_type in dep.gpu_types
        assert dep.gpus_per_replica <= pool.gpus_per_instance
        assert not pol.allowed_jurisdictions or juris[pool.region] in pol.allowed_jurisdictions
        assert not pol.allowed_regions or pool.region in pol.allowed_regions
        assert pol.required_certifications <= pool.certifications
        assert pool.purchase != "spot" or pol.spot_allowed
    for pid, gpus in used.items():
        assert gpus <= pools[pid].capacity_gpus + pools[pid].procurable_gpus, pid
    for name, slots in placed.items():
        dep = deps[name]
        total = sum(n for _, n in slots)
        assert total <= dep.target_replicas
        spot = sum(n for p, n in slots if pools[p].purchase == "spot")
        assert spot <= math.floor(dep.policy.max_spot_fraction * dep.target_replicas + 1e-9)
        assert len({pools[p].provider for p, _ in slots}) >= min(
            dep.policy.min_distinct_providers, total
        )
        assert len({pools[p].region for p, _ in slots}) >= min(
            dep.policy.min_distinct_regions, total
        )
    missing = sum(d.target_replicas for d in inp.deployments) - sum(
        a.replicas for a in result.assignments
    )
    assert missing == sum(u.replicas for u in result.unplaced)
