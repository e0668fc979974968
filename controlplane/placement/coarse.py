"""Quotas for many classes when the min-cost flow (network.py) is not available: the
class LP on merged classes and merged pools (slower, 2-9 CPU s at 1,000+ classes).

Above MAX_CLASSES classes the class x pool LP grows past the re-plan budget (300 classes
x 2,000 pools: 100k columns, ~4 s). Here classes of one replica size and one set of
admissible pools merge (the caller's key), their demand, spot budgets and spread caps
summed and their cost rows averaged, weighted by demand; pools that every merged class
sees alike (same admissibility, spot, provider and region) form one group with their
summed room and room-weighted mean cost. transport.solve on merged classes x groups, its
quotas floor(x), laid into each group's pools (higher priority and bigger replicas
first, each into its cheapest pools with whole-replica room), are shared by the members:
each takes the quota pools cheapest for its own traffic first.
An approximation: the members' latency differences, their own spread policies and a
group's per-pool remainders are not in this LP; the fill, the second LP and repair follow.
Deterministic: everything in index order.
"""

from __future__ import annotations

import numpy as np

from controlplane.placement import transport

GROUP_COST_STEP = 0.1  # $/GPU-hour: pools of one group cost within about this much


def merged_classes(keys: list[tuple]) -> tuple[np.ndarray, int]:
    """Merged class of each class (first-seen order) and their number."""
    index: dict[tuple, int] = {}
    of = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
    return of, len(index)


def pool_groups(finite: np.ndarray, extra: list[np.ndarray]) -> np.ndarray:
    """Group of each pool: same admissibility column (finite, M x P) and same `extra`."""
    cols = np.vstack([finite.astype(np.int64)] + [e.astype(np.int64)[None, :] for e in extra])
    _, first, group = np.unique(cols.T, axis=0, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # number groups by their first pool
    return rank[group.ravel()]


def solve(pr: transport.Problem, of: np.ndarray, n_merged: int) -> np.ndarray | None:
    """Replica quotas per merged class and pool (M x P), or None if the LP fails."""
    n_p = pr.cost.shape[1]
    finite = np.isfinite(pr.cost)
    members = [np.flatnonzero(of == m) for m in range(n_merged)]
    first = np.array([ms[0] for ms in members])
    weight = np.maximum(pr.demand, 0).astype(float)
    cost = np.zeros((n_merged, n_p))
    for m, ms in enumerate(members):
        w = weight[ms] if weight[ms].sum() > 0 else np.ones(len(ms))
        cost[m] = (w[:, None] * np.where(finite[ms], pr.cost[ms], 0.0)).sum(0) / w.sum()
    cost = np.where(finite[first], cost, np.inf)
    seer = np.where(finite[first].any(axis=0), finite[first].argmax(axis=0), 0)
    level = np.round(np.nan_to_num(cost[seer, np.arange(n_p)], posinf=-1.0) / GROUP_COST_STEP)
    group = pool_groups(finite[first], [pr.is_spot, level] + [sp.group for sp in pr.spread])
    n_g = int(group.max()) + 1 if n_p else 0
    free = np.maximum(pr.free, 0).astype(float)
    room = np.bincount(group, weights=free, minlength=n_g)
    g_cost = np.zeros((n_merged, n_g))
    for m in range(n_merged):
        row = np.where(finite[first[m]], cost[m] * np.maximum(free, 1e-9), 0.0)
        g_cost[m] = np.bincount(group, weights=row, minlength=n_g)
    g_cost /= np.bincount(group, weights=np.maximum(free, 1e-9), minlength=n_g)[None, :]
    seen = np.zeros((n_merged, n_g), dtype=bool)
    seen[:, group] = finite[first]
    g_cost = np.where(seen, g_cost, np.inf)
    g_first = np.zeros(n_g, dtype=np.int64)
    g_first[group[::-1]] = np.arange(n_p)[::-1]

    def summed(a: np.ndarray) -> np.ndarray:
        return np.array([a[ms].sum(axis=0) for ms in members])

    spread = tuple(transport.Spread(sp.group[g_first], summed(sp.cap)) for sp in pr.spread)
    merged = transport.Problem(
        cost=g_cost,
        sizes=pr.sizes[first],
        demand=summed(pr.demand),
        spot_cap=summed(pr.spot_cap),
        priority_rank=np.array([pr.priority_rank[ms].max() for ms in members]),
        free=room.astype(np.int64),
        is_spot=pr.is_spot[g_first],
        spread=spread,
    )
    q = transport.solve(merged, rounding_mip=False)  # the lay-out floors per pool anyway
    if q is None:
        return None
    return _lay_out(q, group, n_g, cost, pr.sizes[first], free.astype(np.int64), merged)


def _lay_out(q, group, n_g, cost, sizes, room, merged: transport.Problem) -> np.ndarray:
    """Quota replicas per (merged class, group) into the group's pools: higher priority and
    bigger replicas first, each into its cheapest pools with room."""
    n_m, n_p = cost.shape
    out = np.zeros((n_m, n_p), dtype=np.int64)
    order = np.lexsort((np.arange(n_m), -sizes, -merged.priority_rank))
    pools_of = [np.flatnonzero(group == g) for g in range(n_g)]
    for m in order:
        s = int(sizes[m])
        for g in np.flatnonzero(q[m] > 0):
            ps = pools_of[g]
            ps = ps[np.lexsort((ps, cost[m, ps]))]
            slots = room[ps] // s
            before = np.cumsum(slots) - slots
            take = np.clip(int(q[m, g]) - before, 0, slots)
            out[m, ps] += take
            room[ps] -= take * s
    return out
