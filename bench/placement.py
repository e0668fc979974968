"""Placement benchmark: our engine vs naive greedy vs HiGHS bounds, in one run.

Seeded generator of fleets shaped like ours: 6 providers over 20 locations, 5 GPU types,
reserved / on-demand / spot pools, deployments drawn from a few dozen shapes (replica
size, GPU types, residency, certifications, spot, spread, traffic). Capacity is scaled so
demand is 70 % or 92 % of all usable GPUs. Prints a table, then ONE headline line.

Usage: .venv/bin/python bench/placement.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import resource
import sys
import time
from dataclasses import dataclass

import numpy as np

from controlplane.placement import (
    Cluster,
    Deployment,
    PlacementInput,
    PlacementPolicy,
    PlacementResult,
    Pool,
    Region,
    place,
    replan,
)
from controlplane.placement.constraints import compile_tables
from controlplane.placement.lp import integral_cost_bound, lower_bound, unplaced_optimum

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


SIZES = {
    1: ["L4", "L40S", "A100", "H100"],
    2: ["L40S", "A100", "H100"],
    4: ["A100", "H100", "H200", "L40S"],
    8: ["H100", "H200", "A100"],
}


def _shapes(rng: random.Random, n: int) -> list[tuple[int, tuple[str, ...], PlacementPolicy, str]]:
    shapes = []
    for _ in range(n):
        size = rng.choices([1, 2, 4, 8], weights=[30, 30, 25, 15])[0]
        first = rng.choice(SIZES[size])
        alt = [t for t in SIZES[size] if t != first]
        types = (first, rng.choice(alt)) if rng.random() < 0.5 else (first,)
        r = rng.random()
        juris = EU if r < 0.2 else frozenset({"US", "CA"}) if r < 0.3 else frozenset()
        traffic = "eu" if r < 0.2 else "us" if r < 0.3 else rng.choice(list(TRAFFIC))
        certs = rng.choices(
            [frozenset(), frozenset({"SOC2"}), frozenset({"HIPAA"})], weights=[60, 30, 10]
        )[0]
        spot = rng.random() < 0.4
        policy = PlacementPolicy(
            allowed_jurisdictions=juris,
            required_certifications=certs,
            spot_allowed=spot,
            max_spot_fraction=0.5 if spot else 0.0,
            min_distinct_providers=2 if rng.random() < 0.3 else 1,
            min_distinct_regions=2 if rng.random() < 0.2 else 1,
        )
        shapes.append((size, types, policy, traffic))
    return shapes


def generate(n_pools: int, n_deployments: int, load: float, seed: int = 7) -> PlacementInput:
    """A seeded fleet whose demand is `load` x the usable GPUs."""
    rng = random.Random(seed)
    regions = _regions(rng)
    pools = _pools(rng, regions, n_pools)
    shapes = _shapes(rng, 60)
    deps = []
    for i in range(n_deployments):
        size, types, policy, traffic = rng.choice(shapes)
        deps.append(
            Deployment(
                name=f"dep-{i}",
                gpus_per_replica=size,
                gpu_types=types,
                wanted_replicas=rng.randint(1, 9),
                min_replicas=1,
                policy=policy,
                priority=rng.choice([0, 0, 1, 2]),
                traffic=TRAFFIC[traffic],
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


def naive_greedy(inp: PlacementInput) -> tuple[float, int, float]:
    """Largest replica first, cheapest admissible pool with room (spot within budget)."""
    t0 = time.perf_counter()
    t = compile_tables(inp)
    free = t.cap.copy()
    cost = unplaced = 0.0
    deps = inp.deployments
    for d in sorted(range(len(deps)), key=lambda d: (-deps[d].gpus_per_replica, d)):
        dep = deps[d]
        s = dep.gpus_per_replica
        spot_left = math.floor(dep.policy.max_spot_fraction * dep.target_replicas + 1e-9)
        row = t.cost(d)
        compat = t.compat(d)
        for _ in range(dep.target_replicas):
            ok = compat & (free >= s)
            if spot_left <= 0:
                ok &= ~t.is_spot
            c = np.where(ok, row, np.inf)
            p = int(np.argmin(c))
            if not math.isfinite(c[p]):
                unplaced += s
                continue
            free[p] -= s
            cost += s * float(row[p])
            spot_left -= int(t.is_spot[p])
    return cost, int(unplaced), time.perf_counter() - t0


def unplaced_gpus(r: PlacementResult) -> int:
    return sum(u.replicas * u.gpus_per_replica for u in r.unplaced)


def incremental_ms(inp: PlacementInput, first: PlacementResult, tries: int = 20) -> float:
    """Median time of replan() after scaling one deployment by +1 replica."""
    times = []
    for i in range(tries):
        d = (i * 97) % len(inp.deployments)
        deps = list(inp.deployments)
        deps[d] = dataclasses.replace(deps[d], wanted_replicas=deps[d].wanted_replicas + 1)
        changed = dataclasses.replace(inp, deployments=tuple(deps))
        t0 = time.perf_counter()
        replan(first, changed)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1000


@dataclass
class Row:
    name: str
    secs: float
    gap: float  # cost above the LP bound (with divisibility cuts) at the same volume, percent
    gap_plain: float  # the same against the plain LP (no divisibility cuts)
    gap_int: float  # cost above the best proven bound (LP or MIP) at the same volume; nan: --quick
    unplaced: int
    greedy_secs: float
    greedy_gap: float
    greedy_unplaced: int
    lp_unplaced: float
    opt_bound: int  # proven lower bound on the unplaced GPUs of any integral placement
    opt_found: int  # best integral placement the MIP found (of the relaxation), else -1
    lp_secs: float


def _gap(objective: float, inp: PlacementInput, placed_gpus: int, cuts: bool = True) -> float:
    """Cost above the LP bound at the same placed volume, in percent; the LP carries the
    valid divisibility cuts unless `cuts` is False (the plain LP)."""
    bound = lower_bound(inp, placed_gpus=placed_gpus - 1e-6, divisibility_cuts=cuts)
    return (objective / bound.cost - 1) * 100 if bound.cost > 0 else 0.0


def _gap_integral(objective: float, inp: PlacementInput, placed_gpus: int) -> float:
    """Cost above the best proven bound at the same placed volume, in percent: the LP bound
    or the MIP's dual bound (whole replicas), whichever is higher; both are valid."""
    lp = lower_bound(inp, placed_gpus=placed_gpus - 1e-6).cost
    mip = integral_cost_bound(inp, placed_gpus - 1e-6, time_limit=10.0).cost
    bound = max(lp, mip if math.isfinite(mip) else 0.0)
    return (objective / bound - 1) * 100 if bound > 0 else 0.0


def run_case(
    name: str, n_pools: int, n_deps: int, load: float, mip: bool
) -> tuple[Row, PlacementInput, PlacementResult]:
    inp = generate(n_pools, n_deps, load)
    t0 = time.perf_counter()
    ours = place(inp)
    secs = time.perf_counter() - t0
    g_cost, g_unplaced, g_secs = naive_greedy(inp)
    lp = lower_bound(inp)
    demand = sum(d.target_replicas * d.gpus_per_replica for d in inp.deployments)
    opt, found = lp.unplaced_bound, -1.0
    if mip and unplaced_gpus(ours) > math.ceil(lp.unplaced_gpus - 1e-6):
        best = unplaced_optimum(inp, time_limit=15.0)
        opt, found = max(opt, best.unplaced_bound), best.unplaced_gpus
    placed = demand - unplaced_gpus(ours)
    row = Row(
        name,
        secs,
        _gap(ours.objective_per_hour, inp, placed),
        _gap(ours.objective_per_hour, inp, placed, cuts=False),
        _gap_integral(ours.objective_per_hour, inp, placed) if mip else math.nan,
        unplaced_gpus(ours),
        g_secs,
        _gap(g_cost, inp, demand - g_unplaced),
        g_unplaced,
        lp.unplaced_gpus,
        math.ceil(opt - 1e-6),
        round(found),
        lp.seconds,
    )
    return row, inp, ours


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the MIP for the unplaced optimum")
    args = ap.parse_args()
    cases = [
        ("1k pools x 1k deps, 70%", 1000, 1000, 0.70),
        ("1k pools x 1k deps, 92%", 1000, 1000, 0.92),
        ("2k pools x 10k replicas, 70%", 2000, 2000, 0.70),
        ("2k pools x 10k replicas, 92%", 2000, 2000, 0.92),
    ]
    rows = []
    big: tuple[PlacementInput, PlacementResult] | None = None
    for name, n_pools, n_deps, load in cases:
        row, inp, ours = run_case(name, n_pools, n_deps, load, mip=not args.quick)
        rows.append(row)
        print(f"{name}: done in {row.secs:.2f}s", file=sys.stderr, flush=True)
        if n_deps == 2000 and load == 0.70:
            big = (inp, ours)
    print(
        "LP: HiGHS relaxation at the same placed volume with valid divisibility cuts (and spread "
        "cuts); plain LP: without the divisibility cuts; best: max(LP, MIP dual bound)"
    )
    print(
        f"{'case':32} {'ours s':>7} {'cost vs LP':>10} {'plain LP':>8} {'vs best':>7} "
        f"{'unplaced':>8} | {'greedy s':>8} "
        f"{'cost vs LP':>10} {'unplaced':>8} | {'LP unpl':>7} {'opt >=':>6} {'MIP <=':>6} "
        f"{'LP s':>5}"
    )
    for r in rows:
        found = f"{r.opt_found:6d}" if r.opt_found >= 0 else f"{'-':>6}"
        print(
            f"{r.name:32} {r.secs:7.3f} {r.gap:+9.2f}% {r.gap_plain:+7.2f}% {r.gap_int:+6.2f}% "
            f"{r.unplaced:8d} | "
            f"{r.greedy_secs:8.3f} "
            f"{r.greedy_gap:+9.2f}% {r.greedy_unplaced:8d} | {r.lp_unplaced:7.1f} "
            f"{r.opt_bound:6d} {found} {r.lp_secs:5.1f}"
        )
    assert big is not None
    inc = incremental_ms(*big)
    print(f"incremental (one deployment +1 replica, 2k pools x 10k replicas): {inc:.1f} ms median")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the whole bench process (engine, greedy, LP): {peak:.0f} MiB")
    full = rows[2]
    tight = rows[3]
    # the cost target is checked against the best proven bound at the same volume (LP, or the
    # MIP's dual bound when it was run); the LP, even with its cuts, misses part of the
    # integrality gap
    worst_gap = max(r.gap if math.isnan(r.gap_int) else r.gap_int for r in rows)
    worst_lp = max(r.gap for r in rows)
    worst_plain = max(r.gap_plain for r in rows)
    # the optimum lies in [opt >=, MIP <=]; we ask for no more than the best known integral
    # placement of the relaxation (which ignores spread), or the bound when it is proven
    ceiling = [r.opt_found if r.opt_found >= 0 else r.opt_bound for r in rows]
    ok = (
        max(full.secs, tight.secs) <= 1.0
        and worst_gap <= 0.5
        and all(r.unplaced <= c for r, c in zip(rows, ceiling, strict=True))
        and inc <= 10.0
    )
    print(
        f"placement: re-plan 10k replicas {full.secs:.2f}/{tight.secs:.2f} s at 70/92% "
        f"(greedy {full.greedy_secs:.2f} s), cost {worst_gap:+.2f}% vs best bound "
        f"({worst_lp:+.2f}% vs the LP with valid divisibility cuts, {worst_plain:+.2f}% vs the "
        f"plain LP; greedy {full.greedy_gap:+.2f}%), unplaced at 92% "
        f"{tight.unplaced} vs optimum in [{tight.opt_bound}, {ceiling[3]}] "
        f"(greedy {tight.greedy_unplaced}), "
        f"incremental {inc:.1f} ms — targets <=1 s, <=0.5%, <=optimum, <=10 ms: "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
