"""HiGHS lower bounds for tests and benchmarks; never on the critical path.

The model relaxes the engine's problem: deployments with the same shape (replica size,
GPU types, jurisdiction/region/certification/spot/spread policy, traffic) are merged into
one class, priorities are dropped, the spot fraction is summed per class, and spread is
kept as valid cuts only: a deployment whose admissible pools span a single provider or
region while its policy asks for two counts at most one replica, and one provider (region)
holds at most the class's summed `n - min(k, n) + 1` replicas (n placeable, k asked).
By default it also carries the divisibility cuts of the engine's class LP (`transport.py`):
for each pool p and replica size S > 1 that does not divide its usable GPUs cap_p,
  sum over pairs (c, p) with S | size_c of size_c * x[c, p] <= S * floor(cap_p / S),
valid for whole replicas (the left side is then a multiple of S and at most cap_p), so
a pool's odd remainder cannot be filled with fractions of big replicas.
Every engine placement is feasible for it, so its optimum bounds the engine from below:
  LP:  x >= 0 continuous -> `cost` (min effective $/hour) and `unplaced_gpus`, lexicographic
       (unplaced first, via a penalty far above any price).
  MIP: x integer, objective = unplaced GPUs only -> a bound (and best found) on how many
       GPUs no placement can avoid leaving unplaced, within a time limit; or objective =
       cost at a given placed volume -> HiGHS's dual bound, the LP bound plus (part of) the
       integrality gap.
highspy is imported lazily so the engine package never needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.placement.constraints import Tables, compile_tables
from controlplane.placement.model import PlacementInput
from controlplane.placement.transport import silent_highs


@dataclass(frozen=True)
class Bound:
    cost: float  # effective $/hour of the placed part (engine objective units)
    unplaced_gpus: float  # LP: fractional; MIP: the best integer solution found
    unplaced_bound: float  # a proven lower bound on unplaced GPUs
    seconds: float
    classes: int
    pairs: int


@dataclass
class _Model:
    sizes: np.ndarray
    counts: np.ndarray
    spot_cap: np.ndarray
    pair_class: np.ndarray
    pair_pool: np.ndarray
    pair_cost: np.ndarray
    pair_spot: np.ndarray
    cap: np.ndarray
    spread_pairs: list[np.ndarray]  # per spread row: the pair indices it sums
    spread_cap: list[float]  # per spread row: most replicas one provider (region) may hold
    forced: float  # GPUs the spread rules leave unplaced whatever the placement (see _placeable)
    priority: np.ndarray  # per class (0 for all unless merged by priority)
    forced_high: float  # of `forced`, the GPUs of deployments above the lowest priority


def _divisibility_rows(m: _Model) -> tuple[list[np.ndarray], list[float]]:
    """Divisibility cuts: per pool p and replica size S > 1 with S not dividing cap_p, the
    pairs at p whose class size is a multiple of S, and the bound S * floor(cap_p / S).
    Whole replicas of such sizes use a multiple of S GPUs of p, at most cap_p, so at most
    S * floor(cap_p / S): valid for every whole-replica placement. A row of one pair is
    left out (its column bound floor(cap_p / size) already implies it)."""
    pairs: list[np.ndarray] = []
    bounds: list[float] = []
    if not len(m.pair_pool):
        return pairs, bounds
    size = m.sizes[m.pair_class].astype(np.int64)
    cap = m.cap.astype(np.int64)
    for s in sorted({int(v) for v in m.sizes if v > 1}):
        on = np.flatnonzero((size % s == 0) & (cap[m.pair_pool] % s != 0))
        if not len(on):
            continue
        on = on[np.argsort(m.pair_pool[on], kind="stable")]
        pools, first, n = np.unique(m.pair_pool[on], return_index=True, return_counts=True)
        for p, i, k in zip(pools.tolist(), first.tolist(), n.tolist(), strict=True):
            if k > 1:
                pairs.append(on[i : i + k])
                bounds.append(float(s * (cap[p] // s)))
    return pairs, bounds


def _placeable(t: Tables, d: int, target: int) -> int:
    """Replicas the spread rules allow at most: 1 when the admissible pools span fewer
    providers (regions) than the policy asks for, since two replicas on them would break it.
    A static, placement-independent fact, so keeping the bound a valid one."""
    pol = t.inp.deployments[d].policy
    mask = t.compat(d)
    if pol.min_distinct_providers > 1 and len(set(t.pool_provider[mask].tolist())) < 2:
        return min(target, 1)
    if pol.min_distinct_regions > 1 and len(set(t.pool_region[mask].tolist())) < 2:
        return min(target, 1)
    return target


def _most_on_one(n: int, want: int) -> int:
    """Most replicas of a deployment one provider (region) may hold when it may place at most
    n and asks for `want` distinct ones: with m placed the biggest group holds at most
    m - min(want, m) + 1, which never decreases with m, so m = n bounds every placement."""
    return n - min(want, n) + 1


def _classes(inp: PlacementInput, by_priority: bool = False) -> _Model:
    """Deployments merged by shape (and by priority when ``by_priority``)."""
    t = compile_tables(inp)
    forced = forced_high = 0
    lowest = t.lowest_priority
    priority: list[int] = []
    keys: dict[tuple, int] = {}
    members: list[int] = []
    counts: list[int] = []
    spot_cap: list[int] = []
    most: list[list[int]] = []  # per class: summed most replicas one provider, one region
    for d, dep in enumerate(inp.deployments):
        pol = dep.policy
        key = (
            dep.gpus_per_replica,
            tuple(sorted(dep.gpu_types)),
            pol.allowed_jurisdictions,
            pol.allowed_regions,
            pol.required_certifications,
            pol.spot_allowed and pol.max_spot_fraction > 0,
            tuple(sorted(dep.traffic.items())),
            pol.min_distinct_providers,
            pol.min_distinct_regions,
            dep.priority if by_priority else 0,
        )
        c = keys.setdefault(key, len(keys))
        if c == len(members):
            members.append(d)
            priority.append(dep.priority if by_priority else 0)
            counts.append(0)
            spot_cap.append(0)
            most.append([0, 0])
        n = _placeable(t, d, dep.target_replicas)
        counts[c] += n
        most[c][0] += _most_on_one(n, pol.min_distinct_providers)
        most[c][1] += _most_on_one(n, pol.min_distinct_regions)
        lost = (dep.target_replicas - n) * dep.gpus_per_replica
        forced += lost
        forced_high += lost if dep.priority > lowest else 0
        if pol.spot_allowed:
            spot_cap[c] += math.floor(pol.max_spot_fraction * dep.target_replicas + 1e-9)
    pc, pp, cost = [], [], []
    for c, d in enumerate(members):
        idx = np.flatnonzero(t.compat(d))
        pc.append(np.full(len(idx), c))
        pp.append(idx)
        cost.append(t.cost(d)[idx] * inp.deployments[d].gpus_per_replica)
    pair_pool = np.concatenate(pp) if pp else np.zeros(0, dtype=np.int64)
    pair_class = np.concatenate(pc) if pc else np.zeros(0, dtype=np.int64)
    spread_pairs, spread_cap = [], []
    for c, d in enumerate(members):
        pol = inp.deployments[d].policy
        for i, (want, key) in enumerate(
            (
                (pol.min_distinct_providers, t.pool_provider),
                (pol.min_distinct_regions, t.pool_region),
            )
        ):
            if want < 2:
                continue
            mine = np.flatnonzero(pair_class == c)
            groups = key[pair_pool[mine]]
            for g in np.unique(groups):
                sel = mine[groups == g]
                spread_pairs.append(sel)
                spread_cap.append(float(most[c][i]))
    return _Model(
        sizes=np.array([inp.deployments[d].gpus_per_replica for d in members], dtype=float),
        counts=np.array(counts, dtype=float),
        spot_cap=np.array(spot_cap, dtype=float),
        pair_class=pair_class,
        pair_pool=pair_pool,
        pair_cost=np.concatenate(cost) if cost else np.zeros(0),
        pair_spot=t.is_spot[pair_pool],
        cap=t.cap.astype(float),
        spread_pairs=spread_pairs,
        spread_cap=spread_cap,
        forced=float(forced),
        priority=np.array(priority, dtype=np.int64),
        forced_high=float(forced_high),
    )


def _solve(
    m: _Model,
    integer: bool,
    time_limit: float,
    placed_gpus: float | None = None,
    divisibility_cuts: bool = True,
    counted: np.ndarray | None = None,
) -> tuple[float, float, float, float]:
    """(cost, unplaced GPUs, bound, seconds); ``counted`` (integer only): the classes whose
    unplaced GPUs the MIP minimises and reports (default: all), forced ones not added."""
    import highspy

    n_c, n_p, n_x = len(m.counts), len(m.cap), len(m.pair_pool)
    penalty = 1e3 * (float(m.pair_cost.max() / m.sizes.max()) if n_x else 1.0) + 1e3
    # columns: pairs, then one "unplaced" column per class
    spot_row = n_c + n_p + m.pair_class
    rows, cols, vals = [], [], []
    j = np.arange(n_x)
    rows += [m.pair_class, n_c + m.pair_pool]
    cols += [j, j]
    vals += [np.ones(n_x), m.sizes[m.pair_class]]
    s = np.flatnonzero(m.pair_spot)
    rows.append(spot_row[s])
    cols.append(s)
    vals.append(np.ones(len(s)))
    rows.append(np.arange(n_c))
    cols.append(n_x + np.arange(n_c))
    vals.append(np.ones(n_c))
    n_rows = 2 * n_c + n_p
    for sel in m.spread_pairs:  # spread: one provider (region) holds at most `spread_cap`
        rows.append(np.full(len(sel), n_rows))
        cols.append(sel)
        vals.append(np.ones(len(sel)))
        n_rows += 1
    cut_pairs, cut_cap = _divisibility_rows(m) if divisibility_cuts else ([], [])
    for sel in cut_pairs:  # divisibility: sum of size * x <= S * floor(cap / S)
        rows.append(np.full(len(sel), n_rows))
        cols.append(sel)
        vals.append(m.sizes[m.pair_class[sel]])
        n_rows += 1
    n_base = n_rows
    if placed_gpus is not None:  # volume row: placed GPUs >= placed_gpus
        rows.append(np.full(n_x, n_rows))
        cols.append(j)
        vals.append(m.sizes[m.pair_class])
        n_rows += 1
    r, c, v = (np.concatenate(a) for a in (rows, cols, vals))
    order = np.lexsort((r, c))
    r, c, v = r[order], c[order], v[order]
    n_cols = n_x + n_c
    starts = np.searchsorted(c, np.arange(n_cols + 1))
    if placed_gpus is not None:  # min cost of placing at least `placed_gpus` GPUs
        obj = np.concatenate([m.pair_cost, np.zeros(n_c)])
    elif integer:
        weight = np.ones(n_c) if counted is None else counted.astype(float)
        obj = np.concatenate([np.zeros(n_x), m.sizes * weight])
    else:
        obj = np.concatenate([m.pair_cost, penalty * m.sizes])
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    lp.col_cost_ = obj
    lp.col_lower_ = np.zeros(n_cols)
    # a pool holds at most floor(capacity / size) replicas of a class (valid for integers)
    fits = np.floor(m.cap[m.pair_pool] / m.sizes[m.pair_class])
    lp.col_upper_ = np.concatenate([fits, np.full(n_c, highspy.kHighsInf)])
    n_cuts = len(m.spread_cap) + len(cut_cap)
    lower = [m.counts, np.full(n_p + n_c + n_cuts, -highspy.kHighsInf)]
    upper = [m.counts, m.cap, m.spot_cap, np.array(m.spread_cap), np.array(cut_cap)]
    if n_rows > n_base:
        lower.append(np.array([float(placed_gpus or 0.0)]))
        upper.append(np.array([highspy.kHighsInf]))
    lp.row_lower_ = np.concatenate(lower)
    lp.row_upper_ = np.concatenate(upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = r.astype(np.int32)
    lp.a_matrix_.value_ = v
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * n_cols
    h = silent_highs()
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 1e-4)
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    infeasible = (
        highspy.HighsModelStatus.kInfeasible,
        highspy.HighsModelStatus.kUnboundedOrInfeasible,
    )
    if status in infeasible:  # costs are >= 0: no placement of that volume exists
        return math.inf, math.nan, math.inf, float(h.getRunTime())
    if not integer and status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(
            f"HiGHS did not solve the LP relaxation: {h.modelStatusToString(status)}"
        )
    x = np.array(h.getSolution().col_value)
    if counted is not None:
        unplaced = float((x[n_x:] * m.sizes * counted).sum())
        return math.nan, unplaced, float(h.getInfo().mip_dual_bound), float(h.getRunTime())
    unplaced = float((x[n_x:] * m.sizes).sum())
    cost = float((x[:n_x] * m.pair_cost).sum())
    if integer and placed_gpus is not None:  # a bound on the cost at that volume
        return cost, unplaced, float(h.getInfo().mip_dual_bound), float(h.getRunTime())
    bound = h.getInfo().mip_dual_bound if integer else unplaced
    return cost, unplaced + m.forced, float(bound) + m.forced, float(h.getRunTime())


def lower_bound(
    inp: PlacementInput,
    time_limit: float = 120.0,
    placed_gpus: float | None = None,
    divisibility_cuts: bool = True,
) -> Bound:
    """LP relaxation: min unplaced GPUs, then min effective cost (see module docstring).

    With `placed_gpus`: min effective cost of placing at least that many GPUs, a lower
    bound on the cost of any placement of that volume (compare a placer with the bound at
    its own placed volume, so that placing less is not mistaken for placing cheaper);
    `inf` when no placement of that volume exists. `divisibility_cuts=False` gives the
    plain LP (spread cuts only), a weaker bound: the cuts only tighten it.
    """
    m = _classes(inp)
    cost, unplaced, bound, secs = _solve(m, False, time_limit, placed_gpus, divisibility_cuts)
    return Bound(cost, unplaced, bound - 1e-6, secs, len(m.counts), len(m.pair_pool))


def integral_cost_bound(inp: PlacementInput, placed_gpus: float, time_limit: float = 15.0) -> Bound:
    """MIP: min effective cost of placing at least `placed_gpus` GPUs in whole replicas.

    `cost` is a proven lower bound (HiGHS's dual bound, valid when stopped by the time
    limit too); it is above the LP bound by the integrality gap: a pool shared by several
    replica sizes cannot be split fractionally. `unplaced_gpus` is unused (nan).
    """
    m = _classes(inp)
    _, _, bound, secs = _solve(m, True, time_limit, placed_gpus)
    return Bound(bound, math.nan, math.nan, secs, len(m.counts), len(m.pair_pool))


def unplaced_optimum(inp: PlacementInput, time_limit: float = 20.0) -> Bound:
    """MIP on the merged classes: fewest unplaced GPUs any integer placement can reach."""
    m = _classes(inp)
    _, unplaced, bound, secs = _solve(m, integer=True, time_limit=time_limit)
    return Bound(math.nan, unplaced, bound, secs, len(m.counts), len(m.pair_pool))


def high_priority_unplaced_optimum(inp: PlacementInput, time_limit: float = 20.0) -> Bound:
    """MIP on classes merged by shape and priority: fewest GPUs of deployments above the
    lowest priority that any whole placement leaves unplaced (the lowest may give up room
    to them, as the engine's displacement does). The engine must not leave more: each GPU
    above would be a priority inversion the placement could have avoided."""
    m = _classes(inp, by_priority=True)
    high = m.priority > (int(m.priority.min()) if len(m.priority) else 0)
    if not high.any():
        return Bound(math.nan, 0.0, 0.0, 0.0, len(m.counts), len(m.pair_pool))
    _, unplaced, bound, secs = _solve(m, True, time_limit, counted=high)
    f = m.forced_high
    return Bound(math.nan, unplaced + f, bound + f, secs, len(m.counts), len(m.pair_pool))
