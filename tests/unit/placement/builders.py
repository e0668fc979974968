"""Small builders for placement tests: a world of regions, pools and clusters in a line."""

from __future__ import annotations

from controlplane.placement import (
    Cluster,
    Deployment,
    PlacementInput,
    PlacementPolicy,
    Pool,
    Region,
)

REGIONS = (
    Region("aws:us-east-1", "US", -5),
    Region("gcp:us-central1", "US", -6),
    Region("aws:ca-central-1", "CA", -5),
    Region("aws:eu-central-1", "DE", 1),
    Region("gcp:europe-west4", "NL", 1),
    Region("lambda:us-tx", "US", -6),
)


def make_pool(
    pool_id: str,
    *,
    provider: str = "aws",
    region: str = "aws:us-east-1",
    gpu_type: str = "H100",
    purchase: str = "on_demand",
    capacity: int = 16,
    procurable: int = 0,
    price: float = 3.0,
    interruption_rate: float = 0.0,
    certifications: frozenset[str] = frozenset({"SOC2"}),
    gpus_per_instance: int = 8,
) -> Pool:
    return Pool(
        id=pool_id,
        provider=provider,
        region=region,
        gpu_type=gpu_type,
        purchase=purchase,  # type: ignore[arg-type]
        capacity_gpus=capacity,
        procurable_gpus=procurable,
        price_per_gpu_hour=price,
        interruption_rate_per_hour=interruption_rate,
        certifications=certifications,
        gpus_per_instance=gpus_per_instance,
    )


def make_deployment(
    name: str,
    *,
    gpus: int = 1,
    replicas: int = 1,
    gpu_types: tuple[str, ...] = ("H100",),
    priority: int = 0,
    min_replicas: int = 0,
    traffic: dict[str, float] | None = None,
    **policy: object,
) -> Deployment:
    return Deployment(
        name=name,
        gpus_per_replica=gpus,
        gpu_types=gpu_types,
        wanted_replicas=replicas,
        min_replicas=min_replicas,
        policy=PlacementPolicy(**policy),  # type: ignore[arg-type]
        priority=priority,
        traffic=traffic or {},
    )


def make_input(pools: list[Pool], deployments: list[Deployment], **kw: object) -> PlacementInput:
    """One healthy cluster per pool, named after it (`c-<pool id>`)."""
    clusters = tuple(Cluster(f"c-{p.id}", (p.id,)) for p in pools)
    return PlacementInput(REGIONS, tuple(pools), clusters, tuple(deployments), **kw)  # type: ignore[arg-type]


def replicas_by_pool(result, deployment: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in result.assignments:
        if a.deployment == deployment:
            out[a.pool] = out.get(a.pool, 0) + a.replicas
    return out
