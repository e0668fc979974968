"""Compiles a PlacementInput into numpy tables and answers "may deployment d use pool p?".

Static hard constraints (GPU type, replica fits an instance, jurisdiction, region,
certifications, spot allowed, a healthy cluster draws on the pool) are a boolean mask per
deployment, cached by the policy signature so equal policies share one mask. Capacity,
spread and spot fraction depend on the evolving plan and are checked by the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from controlplane.placement.cost import cost_row, latency_by_region, marginal_price
from controlplane.placement.model import Deployment, PlacementInput, PlacementPolicy, Pool


class PlacementInputError(ValueError):
    """The input is inconsistent; the message says what to fix."""


def _check_unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise PlacementInputError(f"duplicate {kind} `{name}`; give each {kind} a unique name")
        seen.add(name)


def validate(inp: PlacementInput) -> None:
    """Raise PlacementInputError on references to unknown things and impossible numbers."""
    _check_unique("region", [r.name for r in inp.regions])
    _check_unique("pool", [p.id for p in inp.pools])
    _check_unique("cluster", [c.name for c in inp.clusters])
    _check_unique("deployment", [d.name for d in inp.deployments])
    regions = {r.name for r in inp.regions}
    pools = {p.id for p in inp.pools}
    for p in inp.pools:
        if p.region not in regions:
            raise PlacementInputError(f"pool `{p.id}` is in unknown region `{p.region}`; add it")
        if p.capacity_gpus < 0 or p.procurable_gpus < 0 or p.gpus_per_instance < 1:
            raise PlacementInputError(f"pool `{p.id}` has negative GPUs or gpus_per_instance < 1")
    for c in inp.clusters:
        for pid in c.pool_ids:
            if pid not in pools:
                raise PlacementInputError(f"cluster `{c.name}` draws on unknown pool `{pid}`")
    for d in inp.deployments:
        if d.gpus_per_replica < 1 or d.wanted_replicas < 0 or d.min_replicas < 0:
            raise PlacementInputError(
                f"deployment `{d.name}` needs gpus_per_replica >= 1 and replicas >= 0"
            )


@dataclass
class Tables:
    """Column-per-attribute view of the pools plus per-deployment caches."""

    inp: PlacementInput
    pool_ids: list[str]
    pool_index: dict[str, int]
    region_index: dict[str, int]
    region_offsets: np.ndarray
    pool_region: np.ndarray  # int, index into regions
    pool_provider: np.ndarray  # int, index into providers
    providers: list[str]
    cap: np.ndarray  # int64 GPUs usable (capacity + procurable), 0 without a healthy cluster
    capacity: np.ndarray  # int64 GPUs usable without procuring
    price: np.ndarray  # list $/GPU-hour
    unit_cost: np.ndarray  # marginal $/GPU-hour (cost.marginal_price)
    is_spot: np.ndarray
    usable: np.ndarray  # a healthy cluster draws on the pool
    healthy_clusters: list[tuple[str, ...]]  # per pool, sorted names
    dep_index: dict[str, int]
    gpi: np.ndarray  # GPUs per instance
    pool_type: np.ndarray  # int, index into type_index
    type_index: dict[str, int]
    pool_juris: np.ndarray  # int, index into juris_index
    juris_index: dict[str, int]
    pool_certs: np.ndarray  # int64 bit set over cert_bits
    cert_bits: dict[str, int]
    _mask_cache: dict[tuple, np.ndarray] = field(default_factory=dict)
    _cost_cache: dict[tuple, np.ndarray] = field(default_factory=dict)
    _masks: dict[int, np.ndarray] = field(default_factory=dict)
    _costs: dict[int, np.ndarray] = field(default_factory=dict)
    _indices: dict[int, np.ndarray] = field(default_factory=dict)  # id(mask) -> its pools

    @cached_property
    def lowest_priority(self) -> int:
        """The lowest deployment priority: a deployment at it can displace nobody."""
        return min((d.priority for d in self.inp.deployments), default=0)

    def compat_index(self, d: int) -> np.ndarray:
        """Indices of the pools compat(d) admits, ascending."""
        mask = self.compat(d)
        idx = self._indices.get(id(mask))  # masks live in _mask_cache: ids stay valid
        if idx is None:
            idx = np.flatnonzero(mask)
            self._indices[id(mask)] = idx
        return idx

    def compat(self, d: int) -> np.ndarray:
        """Pools deployment d may use, ignoring capacity, spread and spot fraction."""
        mask = self._masks.get(d)
        if mask is None:
            dep = self.inp.deployments[d]
            key = (dep.gpus_per_replica, tuple(sorted(dep.gpu_types)), dep.policy)
            mask = self._mask_cache.get(key)
            if mask is None:
                mask = self._compute_mask(dep)
                self._mask_cache[key] = mask
            self._masks[d] = mask
        return mask

    def cost(self, d: int) -> np.ndarray:
        """Effective $/GPU-hour of every pool for deployment d."""
        row = self._costs.get(d)
        if row is None:
            traffic = self.inp.deployments[d].traffic
            key = tuple(sorted(traffic.items()))
            row = self._cost_cache.get(key)
            if row is None:
                w = self.inp.weights
                lat = latency_by_region(traffic, self.region_index, self.region_offsets, w)
                row = cost_row(self.unit_cost, self.pool_region, lat, w)
                self._cost_cache[key] = row
            self._costs[d] = row
        return row

    def _compute_mask(self, dep: Deployment) -> np.ndarray:
        return self.stage_masks(dep)[-1][1]

    def stage_masks(self, dep: Deployment) -> list[tuple[str, np.ndarray]]:
        """Cumulative masks, one per static constraint in binding_constraint() order."""
        pol: PlacementPolicy = dep.policy
        mask = self.gpi >= dep.gpus_per_replica
        types = [self.type_index.get(t) for t in dep.gpu_types]
        mask &= _among(self.pool_type, types, len(self.type_index))
        stages = [("gpu_types", mask)]
        if pol.allowed_jurisdictions:
            allowed = [i for j, i in self.juris_index.items() if j in pol.allowed_jurisdictions]
            mask = mask & _among(self.pool_juris, allowed, len(self.juris_index))
        stages.append(("allowed_jurisdictions", mask))
        if pol.allowed_regions:
            allowed = [self.region_index.get(r) for r in pol.allowed_regions]
            mask = mask & _among(self.pool_region, allowed, len(self.region_index))
        stages.append(("allowed_regions", mask))
        if pol.required_certifications:
            bits = [self.cert_bits.get(c) for c in pol.required_certifications]
            need = sum(1 << b for b in bits if b is not None)
            if any(b is None for b in bits):
                mask = np.zeros_like(mask)
            mask = mask & ((self.pool_certs & need) == need)
        stages.append(("required_certifications", mask))
        if not pol.spot_allowed or pol.max_spot_fraction <= 0:
            mask = mask & ~self.is_spot
        stages.append(("spot_allowed", mask))
        stages.append(("cluster_health", mask & self.usable))
        return stages

    def jurisdiction_of(self, region: str) -> str:
        return self.inp.regions[self.region_index[region]].jurisdiction


def _among(codes: np.ndarray, allowed: Sequence[int | None], n: int) -> np.ndarray:
    """codes (ints in 0..n-1) in `allowed` (indices below n; None: a name no pool has):
    np.isin by a lookup table."""
    known = [a for a in allowed if a is not None]
    table = np.zeros(n, dtype=bool)
    table[known] = True
    return table[codes]


def binding_constraint(
    pool: Pool, dep: Deployment, types: set[str], pol: PlacementPolicy, juris: str
) -> str | None:
    """Name of the first static constraint the pool fails for the deployment, else None."""
    if pool.gpu_type not in types or dep.gpus_per_replica > pool.gpus_per_instance:
        return "gpu_types"
    if pol.allowed_jurisdictions and juris not in pol.allowed_jurisdictions:
        return "allowed_jurisdictions"
    if pol.allowed_regions and pool.region not in pol.allowed_regions:
        return "allowed_regions"
    if not pol.required_certifications <= pool.certifications:
        return "required_certifications"
    if pool.purchase == "spot" and (not pol.spot_allowed or pol.max_spot_fraction <= 0):
        return "spot_allowed"
    return None


def compile_tables(inp: PlacementInput) -> Tables:
    """Build the tables; raises PlacementInputError on bad input."""
    validate(inp)
    region_index = {r.name: i for i, r in enumerate(inp.regions)}
    providers = sorted({p.provider for p in inp.pools})
    prov_index = {n: i for i, n in enumerate(providers)}
    healthy: dict[str, list[str]] = {p.id: [] for p in inp.pools}
    for c in inp.clusters:
        if c.state == "healthy":
            for pid in c.pool_ids:
                healthy[pid].append(c.name)
    pools = inp.pools
    type_index = {t: i for i, t in enumerate(sorted({p.gpu_type for p in pools}))}
    juris_index = {j: i for i, j in enumerate(sorted({r.jurisdiction for r in inp.regions}))}
    cert_bits = {c: i for i, c in enumerate(sorted({c for p in pools for c in p.certifications}))}
    if len(cert_bits) > 62:
        raise PlacementInputError("more than 62 distinct certifications; merge some")
    usable = np.array([bool(healthy[p.id]) for p in pools], dtype=bool)
    capacity = np.array([p.capacity_gpus for p in pools], dtype=np.int64)
    procurable = np.array([p.procurable_gpus for p in pools], dtype=np.int64)
    return Tables(
        inp=inp,
        pool_ids=[p.id for p in pools],
        pool_index={p.id: i for i, p in enumerate(pools)},
        region_index=region_index,
        region_offsets=np.array([r.utc_offset_hours for r in inp.regions], dtype=float),
        pool_region=np.array([region_index[p.region] for p in pools], dtype=np.int64),
        pool_provider=np.array([prov_index[p.provider] for p in pools], dtype=np.int64),
        providers=providers,
        cap=np.where(usable, capacity + procurable, 0),
        capacity=capacity,
        price=np.array([p.price_per_gpu_hour for p in pools], dtype=float),
        unit_cost=np.array([marginal_price(p, inp.weights) for p in pools], dtype=float),
        is_spot=np.array([p.purchase == "spot" for p in pools], dtype=bool),
        usable=usable,
        healthy_clusters=[tuple(sorted(healthy[p.id])) for p in pools],
        dep_index={d.name: i for i, d in enumerate(inp.deployments)},
        gpi=np.array([p.gpus_per_instance for p in pools], dtype=np.int64),
        pool_type=np.array([type_index[p.gpu_type] for p in pools], dtype=np.int64),
        type_index=type_index,
        pool_juris=np.array(
            [juris_index[inp.regions[region_index[p.region]].jurisdiction] for p in pools],
            dtype=np.int64,
        ),
        juris_index=juris_index,
        pool_certs=np.array(
            [sum(1 << cert_bits[c] for c in p.certifications) for p in pools], dtype=np.int64
        ),
        cert_bits=cert_bits,
    )
