"""Seeded fleets for the placement bench, with a `diversity` knob for deployment shapes.

6 providers over 20 locations, 5 GPU types, reserved / on-demand / spot pools. A shape is
(replica size, GPU types, jurisdictions or an allow-list of regions, certifications, spot,
spread, traffic mix); `diversity` shapes are drawn, every one of them is used, and the
other deployments pick among them, so the engine sees about `diversity` classes (None: one
shape per deployment). Capacity is scaled so demand is `load` x all usable GPUs.
"""

from __future__ import annotations

import dataclasses
import random

from controlplane.placement import (
    Cluster,
    Deployment,
    PlacementInput,
    PlacementPolicy,
    Pool,
    Region,
)

LOCATIONS = [  # (location, jurisdiction, utc offset)
    ("us-west", "US", -8),
    ("us-mountain", "US", -7),
    ("us-central", "US", -6),
    ("us-east", "US", -5),
    ("ca-central", "CA", -5),
    ("br-south", "BR", -3),
    ("uk-south", "GB", 0),
    ("ie-west", "IE", 0),
    ("de-central", "DE", 1),
    ("fr-central", "FR", 1),
    ("nl-west", "NL", 1),
    ("se-north", "SE", 1),
    ("fi-south", "FI", 2),
    ("in-west", "IN", 5.5),
    ("sg-central", "SG", 8),
    ("jp-east", "JP", 9),
    ("kr-central", "KR", 9),
    ("au-east", "AU", 10),
    ("us-east2", "US", -5),
    ("de-west", "DE", 1),
]
EU = frozenset({"DE", "FR", "NL", "SE", "FI", "IE"})
PROVIDERS = {  # provider: (price factor, certifications)
    "aws": (1.25, frozenset({"SOC2", "HIPAA", "ISO27001"})),
    "gcp": (1.2, frozenset({"SOC2", "HIPAA", "ISO27001"})),
    "azure": (1.22, frozenset({"SOC2", "HIPAA", "ISO27001"})),
    "coreweave": (0.9, frozenset({"SOC2"})),
    "nebius": (0.85, frozenset({"SOC2", "ISO27001"})),
    "lambda": (0.8, frozenset()),
}
GPUS = {"H200": (4.5, 8), "H100": (3.5, 8), "A100": (2.0, 8), "L40S": (1.2, 4), "L4": (0.6, 4)}
PURCHASE = {"reserved": 0.6, "on_demand": 1.0, "spot": 0.45}
TRAFFIC = {
    "us": {"aws:us-east": 0.6, "aws:us-west": 0.4},
    "eu": {"aws:de-central": 0.7, "aws:uk-south": 0.3},
    "apac": {"aws:jp-east": 0.5, "aws:sg-central": 0.5},
    "global": {"aws:us-east": 0.5, "aws:de-central": 0.3, "aws:jp-east": 0.2},
}
SIZES = {
    1: ["L4", "L40S", "A100", "H100"],
    2: ["L40S", "A100", "H100"],
    4: ["A100", "H100", "H200", "L40S"],
    8: ["H100", "H200", "A100"],
}
Shape = tuple[int, tuple[str, ...], PlacementPolicy, dict[str, float]]


def _regions(rng: random.Random) -> tuple[Region, ...]:
    out = []
    for prov in PROVIDERS:
        for loc, juris, off in LOCATIONS:
            if prov == "aws" or rng.random() < 0.6:
                out.append(Region(f"{prov}:{loc}", juris, off))
    return tuple(out)


def _pools(rng: random.Random, regions: tuple[Region, ...], n: int) -> list[Pool]:
    pools = []
    for i in range(n):
        reg = rng.choice(regions)
        prov = reg.name.split(":")[0]
        gpu = rng.choices(list(GPUS), weights=[2, 4, 3, 2, 2])[0]
        purchase = rng.choices(list(PURCHASE), weights=[25, 45, 30])[0]
        base, gpi = GPUS[gpu]
        price = base * PROVIDERS[prov][0] * PURCHASE[purchase] * rng.uniform(0.95, 1.05)
        size = gpi * rng.randint(1, 12)
        held = size if purchase == "reserved" else rng.randint(0, size // 2)
        pools.append(
            Pool(
                id=f"{prov}-{reg.name.split(':')[1]}-{gpu.lower()}-{purchase}-{i}",
                provider=prov,
                region=reg.name,
                gpu_type=gpu,
                purchase=purchase,  # type: ignore[arg-type]
                capacity_gpus=held,
                procurable_gpus=size - held,
                price_per_gpu_hour=round(price, 4),
                interruption_rate_per_hour=rng.uniform(0.02, 0.2) if purchase == "spot" else 0.0,
                certifications=PROVIDERS[prov][1],
                gpus_per_instance=gpi,
            )
        )
    return pools


def _traffic(rng: random.Random) -> dict[str, float]:
    """One of the named mixes, or a random mix over 1-3 aws locations."""
    if rng.random() < 0.5:
        return TRAFFIC[rng.choice(list(TRAFFIC))]
    locs = rng.sample(LOCATIONS, rng.randint(1, 3))
    weights = [rng.randint(1, 20) for _ in locs]
    return {f"aws:{loc}": w / sum(weights) for (loc, _, _), w in zip(locs, weights, strict=True)}


def _shape(rng: random.Random, regions: tuple[Region, ...]) -> Shape:
    size = rng.choices([1, 2, 4, 8], weights=[30, 30, 25, 15])[0]
    first = rng.choice(SIZES[size])
    alt = [t for t in SIZES[size] if t != first]
    types = (first, rng.choice(alt)) if rng.random() < 0.5 else (first,)
    r = rng.random()
    juris = EU if r < 0.2 else frozenset({"US", "CA"}) if r < 0.3 else frozenset()
    traffic = TRAFFIC["eu"] if r < 0.2 else TRAFFIC["us"] if r < 0.3 else _traffic(rng)
    # some shapes pin an allow-list of regions (a data-residency or latency contract)
    allowed = frozenset()
    if r >= 0.3 and rng.random() < 0.25:
        allowed = frozenset(reg.name for reg in rng.sample(regions, rng.randint(8, 40)))
    certs = rng.choices(
        [frozenset(), frozenset({"SOC2"}), frozenset({"HIPAA"}), frozenset({"ISO27001"})],
        weights=[55, 25, 10, 10],
    )[0]
    spot = rng.random() < 0.4
    policy = PlacementPolicy(
        allowed_jurisdictions=juris,
        allowed_regions=allowed,
        required_certifications=certs,
        spot_allowed=spot,
        max_spot_fraction=0.5 if spot else 0.0,
        min_distinct_providers=2 if rng.random() < 0.3 else 1,
        min_distinct_regions=2 if rng.random() < 0.2 else 1,
    )
    return size, types, policy, traffic


def generate(
    n_pools: int, n_deployments: int, load: float, seed: int = 7, diversity: int | None = 60
) -> PlacementInput:
    """A seeded fleet whose demand is `load` x the usable GPUs, of `diversity` shapes
    (None: every deployment its own shape)."""
    rng = random.Random(seed)
    regions = _regions(rng)
    pools = _pools(rng, regions, n_pools)
    n_shapes = n_deployments if diversity is None else min(diversity, n_deployments)
    shapes = [_shape(rng, regions) for _ in range(n_shapes)]
    deps = []
    for i in range(n_deployments):
        size, types, policy, traffic = shapes[i] if i < n_shapes else rng.choice(shapes)
        deps.append(
            Deployment(
                name=f"dep-{i}",
                gpus_per_replica=size,
                gpu_types=types,
                wanted_replicas=rng.randint(1, 9),
                min_replicas=1,
                policy=policy,
                priority=rng.choice([0, 0, 1, 2]),
                traffic=traffic,
            )
        )
    demand = sum(d.target_replicas * d.gpus_per_replica for d in deps)
    scale = demand / load / sum(p.capacity_gpus + p.procurable_gpus for p in pools)
    scaled = []
    for p in pools:
        total = max(p.gpus_per_instance, round((p.capacity_gpus + p.procurable_gpus) * scale))
        held = total if p.purchase == "reserved" else min(total, round(p.capacity_gpus * scale))
        scaled.append(dataclasses.replace(p, capacity_gpus=held, procurable_gpus=total - held))
    by_region: dict[str, list[str]] = {}
    for p in scaled:
        by_region.setdefault(p.region, []).append(p.id)
    clusters = tuple(Cluster(f"plane-{r}", tuple(ids)) for r, ids in sorted(by_region.items()))
    return PlacementInput(regions, tuple(scaled), clusters, tuple(deps))
