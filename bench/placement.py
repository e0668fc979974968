"""Placement benchmark: our engine vs naive greedy vs HiGHS bounds, for four shape families.

Fleets come from bench/support/fleet.py: 2,000 pools and 2,000 deployments (~10k
replicas) whose shapes (replica size, GPU types, residency or region allow-list,
certifications, spot, spread, traffic) number 60, 300, 1,000, or one per deployment;
capacity is scaled so demand is 70 % or 92 % of all usable GPUs. For each family it prints
the re-plan time at 70/92 % (CPU seconds of the single-threaded place() call, the least
of TIME_RUNS = 3 calls, which the <= 1 s target is judged on, the most of them and the
wall time beside it: on a shared machine wall time is 2-5x the CPU time and measures the
other jobs as much as the engine; until session 14 one call was timed), the cost above
the LP bound at the same placed volume, the
unplaced GPUs at 92 % against the optimum's interval, and one incremental change; then
ONE headline line, PASS only when every family meets every target. Exits 1 on FAIL.

Session 17 (2026-12-06, a fast machine: naive greedy 0.057-0.104 s; code unchanged): seed 7
PASS (worst 0.75 CPU s, every unplaced figure on its bound, cost <= +0.40 %); seed 11 FAILs
on one/92 % only (2305 vs the LP bound 2304, optimum unknown), seed 13 on 60/70 % only (1434
vs the MIP's 1430: the class LP ranks every class alike when each holds a top-priority
member); docs/placement.md "Status (issue 13, session 17 ...)".

Session 16 (2026-12-06, a machine ~1.7-2.4x slower than session 15's: its naive greedy
took 0.12-0.35 s against 0.08-0.10 s): after the pool tie-break in the flow, every unplaced
figure of seed 7 is on its bound (1,000/92 % 2731, one/92 % 2674; before: 2735, 2682) and
every cost within +0.40 %; FAIL on time only, in 3 cases (300/92 % 1.02, one/70 % 1.16,
one/92 % 1.84 CPU s while the machine slowed ~1.75x); docs/placement.md "Status (issue 13,
session 16 ...)".

Session 14 (2026-12-06, least of 3 calls; the machine slowed during the run): seed 7
FAILs on 1,000/92 % (2735 vs 2731) and one/92 % (2682 vs 2674), every time <= 0.86 CPU s;
seed 11 on 1,000/92 % (1701 vs 1700), one/92 % (2309 vs 2304) and time (1.01-1.08 s in
three cases); seed 13 on 60/70 % (1434 vs 1430), 1,000/92 % (3414 vs 3410) and time (1.09,
1.25 s); docs/placement.md "Status (issue 13, session 14 ...)".

Session 13 (2026-12-06, a slower machine): seed 7 FAILs only on the one-per-deployment
time (1.15 / 1.45 CPU s), seed 11 on that, 60/92 % (1888 vs 1885) and 1,000/92 % (1702 vs
the bound 1700); docs/placement.md "Status (issue 13, session 13 ...)".

Session 12 (2026-12-06, another machine): "hi-prio" added (GPUs above the lowest priority
left unplaced, against a MIP that ranks priorities): 0 in all 24 cases of seeds 7, 11, 13
after the eviction fixes (356-609 GPUs at 60 shapes before). FAIL on every seed: the
one-per-deployment family takes 1.0-1.33 CPU s on this machine (1.04-1.07 s before the
fixes too); seed 11 60/92 % 1888 vs 1885; 1,000/92 % on seeds 11 and 13 above the proven
bound where the 15 s MIP found no placement; seed 13 60/70 % 1434 vs 1430 and +0.51 %.

Where it stood (session 11, 2026-12-06, the machine quiet, docs/placement.md "Status"):
seed 7 PASS (worst 0.79 CPU s, +0.43 %, every unplaced figure at the optimum). Seed 11
FAIL: 60 shapes at 92 % leave 1886 GPUs unplaced vs the optimum 1885. Seed 13 FAIL: 60
shapes at 70 % 1434 vs 1430, and 1,000 shapes at 92 % +0.51 %. Every other case of the 24
meets every target; worst time 0.79 CPU s. The LP bounds of a one-per-deployment case
take 40-150 s on a quiet machine (80-215 s on session 16's slower one): each may take
BOUND_SECS (600 s; 300 s until session 16) before its case counts as unbounded. --no-bound skips the bounds (time and unplaced only).

Since session 22 it runs seeds 7 (the one tuned on) and 101 (never tuned on) by default,
each with its own table; the headline is PASS only when every seed passes.

Usage: .venv/bin/python bench/placement.py [--quick | --no-bound] [--seeds 7,101 | --seed N]
       [--families 60,300,1000,one]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.support.fleet import generate
from controlplane.placement import PlacementInput, PlacementResult, place, replan
from controlplane.placement.constraints import compile_tables
from controlplane.placement.lp import (
    high_priority_unplaced_optimum,
    integral_cost_bound,
    lower_bound,
    unplaced_optimum,
)

SEEDS = "7,101"  # the fleet tuned on, and one never tuned on
FAMILIES = {"60": 60, "300": 300, "1000": 1000, "one": None}
N_POOLS, N_DEPLOYMENTS = 2000, 2000
TARGET_SECS, TARGET_GAP, TARGET_INC_MS = 1.0, 0.5, 10.0
# place() calls timed per case; the target is judged on the least CPU time (the calls do
# the same work: what more one takes is the machine's other jobs), the most is printed
TIME_RUNS = 3
BOUND_SECS = 600.0  # HiGHS time limit of each LP bound (one per deployment: 40-215 s seen)


def naive_greedy(inp: PlacementInput) -> tuple[int, float]:
    """Largest replica first, cheapest admissible pool with room (spot within budget)."""
    t0 = time.perf_counter()
    t = compile_tables(inp)
    free = t.cap.copy()
    unplaced = 0
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
            spot_left -= int(t.is_spot[p])
    return unplaced, time.perf_counter() - t0


def unplaced_gpus(r: PlacementResult) -> int:
    return sum(u.replicas * u.gpus_per_replica for u in r.unplaced)


def high_priority_unplaced(inp: PlacementInput, r: PlacementResult) -> int:
    """GPUs of deployments above the lowest priority left unplaced."""
    low = min(d.priority for d in inp.deployments)
    above = {d.name for d in inp.deployments if d.priority > low}
    return sum(u.replicas * u.gpus_per_replica for u in r.unplaced if u.deployment in above)


def incremental_ms(inp: PlacementInput, first: PlacementResult, tries: int = 20) -> float:
    """Median CPU time of replan() after scaling one deployment by +1 replica."""
    times = []
    for i in range(tries):
        d = (i * 97) % len(inp.deployments)
        deps = list(inp.deployments)
        deps[d] = dataclasses.replace(deps[d], wanted_replicas=deps[d].wanted_replicas + 1)
        changed = dataclasses.replace(inp, deployments=tuple(deps))
        t0 = time.process_time()
        replan(first, changed)
        times.append(time.process_time() - t0)
    return sorted(times)[len(times) // 2] * 1000


@dataclass
class Row:
    family: str
    load: float
    classes: int  # classes of the LP bound (deployments merged by shape)
    replicas: int
    secs: float  # CPU seconds of place() (the target's measure)
    wall: float  # wall seconds of the same call
    gap: float  # cost above the LP bound (with divisibility cuts) at the same volume, %
    gap_best: float  # above max(LP, MIP dual bound) where the MIP ran, else = gap
    unplaced: int
    greedy_secs: float
    greedy_unplaced: int
    lp_unplaced: float
    opt_bound: int  # proven lower bound on the unplaced GPUs of any whole placement
    opt_found: int  # best whole placement the MIP found (of the relaxation), else -1
    bound_secs: float  # seconds the bounds took (not the engine)
    high: int = 0  # GPUs above the lowest priority left unplaced
    high_ceiling: int = 0  # the fewest any placement must leave (MIP), -1 unknown
    secs_max: float = 0.0  # the most CPU seconds of the TIME_RUNS calls

    @property
    def ceiling(self) -> int:
        """What ours must not exceed: the MIP's best placement, else the proven bound."""
        return self.opt_found if self.opt_found >= 0 else self.opt_bound

    @property
    def ok(self) -> bool:
        return (
            self.secs <= TARGET_SECS
            and self.gap_best <= TARGET_GAP  # False when no bound was proven (nan)
            and self.ceiling >= 0
            and self.unplaced <= self.ceiling
            and self.high <= max(self.high_ceiling, 0)  # -1: the MIP found no placement
        )


def run_case(
    family: str, load: float, seed: int, mip: bool, bound: bool = True
) -> tuple[Row, PlacementInput, PlacementResult]:
    inp = generate(N_POOLS, N_DEPLOYMENTS, load, seed=seed, diversity=FAMILIES[family])
    runs = []  # place() is deterministic: each call does the same work
    for _ in range(TIME_RUNS):
        c0, t0 = time.process_time(), time.perf_counter()
        ours = place(inp)
        runs.append((time.process_time() - c0, time.perf_counter() - t0))
    (secs, wall), secs_max = min(runs), max(cpu for cpu, _wall in runs)
    g_unplaced, g_secs = naive_greedy(inp)
    t0 = time.perf_counter()
    demand = sum(d.target_replicas * d.gpus_per_replica for d in inp.deployments)
    mine = unplaced_gpus(ours)
    try:  # an LP that does not finish in BOUND_SECS proves nothing: the case fails
        if not bound:  # --no-bound: time and unplaced only
            raise RuntimeError("no bound asked for")
        lp = lower_bound(inp, time_limit=BOUND_SECS)
        at_volume = lower_bound(inp, BOUND_SECS, placed_gpus=demand - mine - 1e-6).cost
    except RuntimeError:
        lp, at_volume = None, math.nan
    lp_unplaced = lp.unplaced_gpus if lp else math.nan
    opt, found = (lp.unplaced_bound if lp else -1.0), -1.0
    if lp and mip and mine > math.ceil(lp_unplaced - 1e-6):
        best = unplaced_optimum(inp, time_limit=15.0)
        opt = max(opt, best.unplaced_bound)
        # a MIP stopped before its first whole placement reports 0: not a placement
        found = best.unplaced_gpus if best.unplaced_gpus >= opt - 1e-6 else -1.0
    high, high_ceiling = high_priority_unplaced(inp, ours), 0
    if high:  # could a placement have left fewer? (else: a priority inversion)
        hp = high_priority_unplaced_optimum(inp, time_limit=30.0) if bound else None
        # as above: a MIP stopped before its first placement reports 0, which is none
        placed = hp is not None and hp.unplaced_gpus >= hp.unplaced_bound - 1e-6
        high_ceiling = round(hp.unplaced_gpus) if hp is not None and placed else -1
    gap = (ours.objective_per_hour / at_volume - 1) * 100 if at_volume > 0 else math.nan
    gap_best = gap
    if mip and gap > TARGET_GAP:  # the MIP's dual bound may close part of the integrality gap
        dual = integral_cost_bound(inp, demand - mine - 1e-6, time_limit=10.0).cost
        best_bound = max(at_volume, dual if math.isfinite(dual) else 0.0)
        gap_best = (ours.objective_per_hour / best_bound - 1) * 100
    row = Row(
        family,
        load,
        lp.classes if lp else -1,
        sum(d.target_replicas for d in inp.deployments),
        secs,
        wall,
        gap,
        gap_best,
        mine,
        g_secs,
        g_unplaced,
        lp_unplaced,
        math.ceil(opt - 1e-6),
        round(found),
        time.perf_counter() - t0,
        high,
        high_ceiling,
        secs_max,
    )
    return row, inp, ours


def print_table(rows: list[Row], inc: dict[str, float]) -> None:
    print(
        "LP: HiGHS relaxation at the same placed volume with valid divisibility and spread "
        "cuts; best: max(LP, MIP dual bound) where the MIP ran; opt in [opt >=, MIP <=]"
    )
    print(
        f"{'family':>6} {'load':>4} {'classes':>7} {'replicas':>8} {'cpu s':>6} {'max s':>6} {'wall s':>6} "
        f"{'vs LP':>7} {'vs best':>7} {'unplaced':>8} {'opt >=':>6} {'MIP <=':>6} | "
        f"{'greedy s':>8} {'unplaced':>8} | {'inc ms':>6} {'bound s':>7} {'hi-prio':>9} {'ok':>4}"
    )
    for r in rows:
        found = f"{r.opt_found:6d}" if r.opt_found >= 0 else f"{'-':>6}"
        print(
            f"{r.family:>6} {r.load:4.0%} {r.classes:7d} {r.replicas:8d} {r.secs:6.3f} {r.secs_max:6.3f} {r.wall:6.2f} "
            f"{r.gap:+6.2f}% {r.gap_best:+6.2f}% {r.unplaced:8d} {r.opt_bound:6d} {found} | "
            f"{r.greedy_secs:8.3f} {r.greedy_unplaced:8d} | {inc[r.family]:6.1f} "
            f"{r.bound_secs:7.1f} {_high(r):>9} {'yes' if r.ok else 'NO':>4}"
        )


def _high(r: Row) -> str:
    """GPUs above the lowest priority left unplaced (/ the fewest possible, when some)."""
    if not r.high:
        return "0"
    return f"{r.high}/{r.high_ceiling if r.high_ceiling >= 0 else '?'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the MIPs (unplaced, cost)")
    ap.add_argument(
        "--no-bound",
        action="store_true",
        help="skip the LP bounds and MIPs (minutes at 1,000+ classes): time and unplaced only; "
        "the cases show nan and the headline FAIL",
    )
    ap.add_argument(
        "--seeds",
        default=SEEDS,
        help="fleets to run, comma-separated; PASS only when every one passes (default: 7, "
        "the one tuned on, and 101, never tuned on)",
    )
    ap.add_argument("--seed", type=int, help="one fleet only (the same as --seeds N)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="of 60,300,1000,one")
    args = ap.parse_args()
    families = args.families.split(",")
    seeds = [args.seed] if args.seed is not None else [int(v) for v in args.seeds.split(",")]
    # a control plane re-plans in a process that has placed before: one small fleet first
    # (another seed), so that the first case's time holds no one-time imports (~0.1 s)
    place(generate(50, 50, 0.7, seed=seeds[0] + 1, diversity=None))
    rows: list[Row] = []
    inc: dict[str, float] = {}
    for seed in seeds:
        for family in families:
            for load in (0.70, 0.92):
                row, inp, ours = run_case(
                    family,
                    load,
                    seed,
                    mip=not (args.quick or args.no_bound),
                    bound=not args.no_bound,
                )
                rows.append(row)
                if load == 0.70:
                    inc[f"{family}/{seed}"] = incremental_ms(inp, ours)
                print(
                    f"seed {seed} {family}/{load:.0%}: place() {row.secs:.2f} CPU s (least of "
                    f"{TIME_RUNS}; most {row.secs_max:.2f}), {row.wall:.2f} s wall, "
                    f"{row.unplaced} GPUs unplaced, {row.gap:+.2f}% vs LP",
                    file=sys.stderr,
                    flush=True,
                )
        print(f"seed {seed}:")
        print_table(rows[-2 * len(families) :], {f: inc[f"{f}/{seed}"] for f in families})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the whole bench process (engine, greedy, LP): {peak:.0f} MiB")
    ok = all(r.ok for r in rows) and all(v <= TARGET_INC_MS for v in inc.values())
    worst_secs = max(r.secs for r in rows)
    worst_gap = max(r.gap_best for r in rows)
    tight = [r for r in rows if r.load == 0.92 and r.ceiling >= 0]
    unproven = sum(r.ceiling < 0 or math.isnan(r.gap) for r in rows)
    over = max(tight or rows, key=lambda r: r.unplaced - r.ceiling)
    inverted = max(r.high - max(r.high_ceiling, 0) for r in rows)
    print(
        f"placement ({len(families)} families x 70/92%, seeds {','.join(map(str, seeds))}): re-plan ~10k "
        f"replicas worst {worst_secs:.2f} CPU s (least of {TIME_RUNS} calls; wall {max(r.wall for r in rows):.2f} s), cost worst {worst_gap:+.2f}% vs best bound "
        f"(LP with valid divisibility cuts, or the MIP dual bound), unplaced at 92% worst "
        f"{over.unplaced - over.ceiling:+d} GPUs vs optimum ({over.family}: {over.unplaced} vs "
        f"[{over.opt_bound}, {over.ceiling}]; {unproven} cases without a bound), "
        f"higher priorities left unplaced beyond the fewest possible worst {inverted} GPUs, "
        f"incremental worst {max(inc.values()):.1f} CPU ms "
        f"— targets <=1 CPU s, <=0.5%, <=optimum, 0, <=10 ms in every family: "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
