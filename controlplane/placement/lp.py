"""HiGHS lower bounds for tests and benchmarks; never on the critical path.

The model relaxes the engine's problem: deployments with the same shape (replica size,
GPU types, jurisdiction/region/certification/spot policy, traffic) are merged into one
class, spread rules and priorities are dropped (except that a deployment whose admissible
pools span a single provider or region while its policy asks for two counts at most one
replica), and the spot fraction is summed per class.
Every engine placement is feasible for it, so its optimum bounds the engine from below:
  LP:  x >= 0 continuous -> `cost` (min effective $/hour) and `unplaced_gpus`, lexicographic
       (unplaced first, via a penalty far above any price).
  MIP: x integer, objective = unplaced GPUs only -> a bound (and best found) on how many
       GPUs no placement can avoid leaving unplaced, within a time limit.
highspy is imported lazily so the engine package never needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.placement.constraints import Tables, compile_tables
from controlplane.placement.model import PlacementInput


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
    forced: float  # GPUs the spread rules leave unplaced whatever the placement (see _placeable)


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


def _classes(inp: PlacementInput) -> _Model:
    t = compile_tables(inp)
    forced = 0
    keys: dict[tuple, int] = {}
    members: list[int] = []
    counts: list[int] = []
    spot_cap: list[int] = []
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
        )
        c = keys.setdefault(key, len(keys))
        if c == len(members):
            members.append(d)
            counts.append(0)
            spot_cap.append(0)
        counts[c] += _placeable(t, d, dep.target_replicas)
        forced += (
            dep.target_replicas - _placeable(t, d, dep.target_replicas)
        ) * dep.gpus_per_replica
        if pol.spot_allowed:
            spot_cap[c] += math.floor(pol.max_spot_fraction * dep.target_replicas + 1e-9)
    pc, pp, cost = [], [], []
    for c, d in enumerate(members):
        idx = np.flatnonzero(t.compat(d))
        pc.append(np.full(len(idx), c))
        pp.append(idx)
        cost.append(t.cost(d)[idx] * inp.deployments[d].gpus_per_replica)
    pair_pool = np.concatenate(pp) if pp else np.zeros(0, dtype=np.int64)
    return _Model(
        sizes=np.array([inp.deployments[d].gpus_per_replica for d in members], dtype=float),
        counts=np.array(counts, dtype=float),
        spot_cap=np.array(spot_cap, dtype=float),
        pair_class=np.concatenate(pc) if pc else np.zeros(0, dtype=np.int64),
        pair_pool=pair_pool,
        pair_cost=np.concatenate(cost) if cost else np.zeros(0),
        pair_spot=t.is_spot[pair_pool],
        cap=t.cap.astype(float),
        forced=float(forced),
    )


def _solve(
    m: _Model, integer: bool, time_limit: float, placed_gpus: float | None = None
) -> tuple[float, float, float, float]:
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
    if placed_gpus is not None and not integer:  # volume row: placed GPUs >= placed_gpus
        rows.append(np.full(n_x, n_rows))
        cols.append(j)
        vals.append(m.sizes[m.pair_class])
        n_rows += 1
    r, c, v = (np.concatenate(a) for a in (rows, cols, vals))
    order = np.lexsort((r, c))
    r, c, v = r[order], c[order], v[order]
    n_cols = n_x + n_c
    starts = np.searchsorted(c, np.arange(n_cols + 1))
    if integer:
        obj = np.concatenate([np.zeros(n_x), m.sizes])
    elif placed_gpus is not None:  # min cost of placing at least `placed_gpus` GPUs
        obj = np.concatenate([m.pair_cost, np.zeros(n_c)])
    else:
        obj = np.concatenate([m.pair_cost, penalty * m.sizes])
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    lp.col_cost_ = obj
    lp.col_lower_ = np.zeros(n_cols)
    # a pool holds at most floor(capacity / size) replicas of a class (valid for integers)
    fits = np.floor(m.cap[m.pair_pool] / m.sizes[m.pair_class])
    lp.col_upper_ = np.concatenate([fits, np.full(n_c, highspy.kHighsInf)])
    lower = [m.counts, np.full(n_p + n_c, -highspy.kHighsInf)]
    upper = [m.counts, m.cap, m.spot_cap]
    if n_rows > 2 * n_c + n_p:
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
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit))
    h.passModel(lp)
    h.run()
    x = np.array(h.getSolution().col_value)
    unplaced = float((x[n_x:] * m.sizes).sum())
    cost = float((x[:n_x] * m.pair_cost).sum())
    bound = h.getInfo().mip_dual_bound if integer else unplaced
    return cost, unplaced + m.forced, float(bound) + m.forced, float(h.getRunTime())


def lower_bound(
    inp: PlacementInput, time_limit: float = 120.0, placed_gpus: float | None = None
) -> Bound:
    """LP relaxation: min unplaced GPUs, then min effective cost (see module docstring).

    With `placed_gpus`: min effective cost of placing at least that many GPUs, a lower
    bound on the cost of any placement of that volume (compare a placer with the bound at
    its own placed volume, so that placing less is not mistaken for placing cheaper).
    """
    m = _classes(inp)
    cost, unplaced, bound, secs = _solve(m, False, time_limit, placed_gpus)
    return Bound(cost, unplaced, bound - 1e-6, secs, len(m.counts), len(m.pair_pool))


def unplaced_optimum(inp: PlacementInput, time_limit: float = 20.0) -> Bound:
    """MIP on the merged classes: fewest unplaced GPUs any integer placement can reach."""
    m = _classes(inp)
    _, unplaced, bound, secs = _solve(m, integer=True, time_limit=time_limit)
    return Bound(math.nan, unplaced, bound, secs, len(m.counts), len(m.pair_pool))
