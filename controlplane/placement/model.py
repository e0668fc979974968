"""Input and output shapes of the placement engine: frozen dataclasses, plain data only.

Invariants: every value here is immutable and hashable; money is a float in US dollars per
hour (the adapter converts `Decimal` prices with `float()`; results are rounded to 1e-6);
GPU counts are ints; names and ids are strings that must be unique within their kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

PurchaseType = Literal["reserved", "on_demand", "spot"]
ClusterState = Literal["healthy", "degraded", "draining", "unhealthy", "offline"]
ChangeKind = Literal["add", "remove", "move"]


@dataclass(frozen=True, slots=True)
class Region:
    """A provider region: `name` is the key pools and traffic refer to (e.g. "aws:us-east-1")."""

    name: str
    jurisdiction: str  # ISO 3166-1 alpha-2 country code, e.g. "US", "DE"
    utc_offset_hours: float  # location for the latency term (~5 ms one way per time zone)


@dataclass(frozen=True, slots=True)
class Pool:
    """GPUs of one type in one region of one provider, bought one way.

    `capacity_gpus` is what placement may use without buying more: reserved commitment or
    held instances, *including* the GPUs the current placement already occupies.
    `procurable_gpus` is what can still be bought (on-demand quota headroom, spot GPUs on
    offer); always 0 for reserved pools.
    """

    id: str
    provider: str
    region: str
    gpu_type: str
    purchase: PurchaseType
    capacity_gpus: int
    price_per_gpu_hour: float
    procurable_gpus: int = 0
    interruption_rate_per_hour: float = 0.0  # spot only: expected interruptions per hour
    certifications: frozenset[str] = frozenset()  # the provider's, e.g. {"SOC2", "HIPAA"}
    gpus_per_instance: int = 8  # a replica never spans instances: gpus_per_replica <= this


@dataclass(frozen=True, slots=True)
class Cluster:
    """A workload plane; only `healthy` clusters keep or receive replicas."""

    name: str
    pool_ids: tuple[str, ...]
    state: ClusterState = "healthy"


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """Hard constraints of a deployment. Empty allow-lists mean "anywhere"."""

    allowed_jurisdictions: frozenset[str] = frozenset()
    allowed_regions: frozenset[str] = frozenset()
    required_certifications: frozenset[str] = frozenset()
    spot_allowed: bool = False
    max_spot_fraction: float = 0.0  # spot replicas <= floor(this x target replicas)
    min_distinct_providers: int = 1  # placed replicas span >= min(this, placed) providers
    min_distinct_regions: int = 1  # placed replicas span >= min(this, placed) regions


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model served by vLLM; wants `max(wanted_replicas, min_replicas)` replicas."""

    name: str
    gpus_per_replica: int
    gpu_types: tuple[str, ...]
    wanted_replicas: int
    min_replicas: int = 0
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    priority: int = 0  # higher wins under scarcity and may displace lower
    traffic: Mapping[str, float] = field(default_factory=dict)  # region name -> weight

    def __hash__(self) -> int:  # traffic is a dict; name identifies a deployment
        return hash(self.name)

    @property
    def target_replicas(self) -> int:
        return max(self.wanted_replicas, self.min_replicas)


@dataclass(frozen=True, slots=True)
class Assignment:
    """`replicas` replicas of `deployment` on `cluster`, drawing GPUs from `pool`."""

    deployment: str
    cluster: str
    pool: str
    replicas: int


@dataclass(frozen=True, slots=True)
class CostWeights:
    """How the objective turns price, interruptions, latency and churn into $/GPU-hour.

    Reserved GPUs are already paid: their marginal cost is `reserved_price_factor` x price
    (0 by default), so they fill first. Spot costs price x (1 + rate x loss hours).
    """

    latency_cost_per_ms: float = 0.004  # $/GPU-hour per ms of traffic-weighted latency
    ms_per_time_zone: float = 5.0
    spot_interruption_loss_hours: float = 0.5  # GPU-hours wasted per interruption
    reserved_price_factor: float = 0.0
    churn_cost_per_gpu_hour: float = 0.10  # a kept replica moves only to save more than this


@dataclass(frozen=True, slots=True)
class PlacementInput:
    regions: tuple[Region, ...]
    pools: tuple[Pool, ...]
    clusters: tuple[Cluster, ...]
    deployments: tuple[Deployment, ...]
    current: tuple[Assignment, ...] = ()
    weights: CostWeights = field(default_factory=CostWeights)


@dataclass(frozen=True, slots=True)
class Change:
    """`add`: new replicas (to_*); `remove`: stopped replicas (from_*); `move`: both."""

    kind: ChangeKind
    deployment: str
    replicas: int
    from_cluster: str | None = None
    from_pool: str | None = None
    to_cluster: str | None = None
    to_pool: str | None = None


@dataclass(frozen=True, slots=True)
class Procurement:
    """Buy `gpus` more GPUs (`instances` instances) in `pool` to carry out the placement."""

    pool: str
    gpus: int
    instances: int


@dataclass(frozen=True, slots=True)
class Unplaced:
    """Replicas the engine could not place; `constraint` names the binding one.

    `constraint` is one of: gpu_types, allowed_jurisdictions, allowed_regions,
    required_certifications, spot_allowed, cluster_health, capacity, min_distinct_providers,
    min_distinct_regions, max_spot_fraction, priority.
    """

    deployment: str
    replicas: int
    gpus_per_replica: int
    constraint: str
    reason: str
    displaced_by: str | None = None  # set when a higher-priority deployment took the room


@dataclass(frozen=True, slots=True)
class PlacementResult:
    assignments: tuple[Assignment, ...]
    changes: tuple[Change, ...]
    procurement: tuple[Procurement, ...]
    unplaced: tuple[Unplaced, ...]
    cost_per_hour: Mapping[str, float]  # per deployment, at list price (reserved included)
    total_cost_per_hour: float
    objective_per_hour: float  # what the engine minimised: effective cost + latency term
    state: Any = field(default=None, repr=False, compare=False)  # warm start for replan()

    def __hash__(self) -> int:
        return hash(self.assignments)
