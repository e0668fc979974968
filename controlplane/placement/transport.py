"""Class-level transportation LP (HiGHS dual simplex) that hands replica quotas to the fill.

Deployments of one shape (replica size, admissible pools, cost row, priority) form a class.
The LP chooses x[c, p] replicas of class c in pool p, 0 <= x <= floor(free_p / size_c):
  min  sum size_c * cost[c, p] * x[c, p] + sum size_c * penalty_c * unplaced_c
  s.t. sum_p x[c, p] + unplaced_c = demand_c          (every replica placed or counted)
       sum_c size_c * x[c, p] <= free_p               (no pool over-committed)
       sum_{p spot} x[c, p] <= spot_c                 (summed spot budgets of the class)
       sum_{c: S | size_c} size_c * x[c, p] <= S * floor(free_p / S)   (divisibility cuts)
       sum_{p in g} x[c, p] <= spread cap[c, g]        (per provider g, per region g)
The divisibility cuts, one per pool and replica size S > 1 that does not divide free_p,
hold for whole replicas (replicas whose size is a multiple of S use a multiple of S GPUs).
Without them the LP fills a pool's odd remainder with fractions of big replicas; with them
its optimum is within a few GPUs of the whole-replica optimum and few values are fractional.
The spread caps (the caller's: the most replicas of the class one provider or region may
hold so that every member can still span the providers/regions it asks for) keep the
quotas of a spread-needing class on enough providers for its members to share.
penalty_c is far above any price and grows by PRIORITY_STEP per priority level, so placing
wins over cost and higher priority over lower. Only each class's cheapest pools start as
columns; columns with a negative reduced cost are added until none is left (column
generation), so the answer is the optimum of the full LP; small problems start with every
column. Quotas are floor(x).

Deterministic: one thread, an iteration limit (never a time limit: no clock in a decision).
Returns None when HiGHS is missing or does not finish; the caller then fills greedily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # imported with the module, not in the first place() call (~0.1 CPU s of a re-plan)
    import highspy
    import highspy._core  # noqa: F401
except ImportError:  # pragma: no cover - highspy is a dependency; greedy fallback
    pass

ITERATION_LIMIT = 200_000
MAX_ROUNDS = 30  # column-generation rounds
ENTER_PER_CLASS = 32  # columns added per class and round, most negative first
COVER = 3.0  # initial columns: cheapest pools holding COVER x the class's demand
MIN_COLUMNS = 24
ALL_COLUMNS = 60_000  # up to this many admissible pairs, all are columns from the start
PRIORITY_STEP = 10.0
MAX_PRIORITY_LEVELS = 5
TOL = 1e-7
MIP_POOLS = 16  # pools with room per class in the rounding MIP, besides the split ones
MIP_NODES = 200  # branch-and-bound nodes of the whole-replica rounding MIP
MIP_GAP = 1e-6  # relative to an objective dominated by the unplaced penalty


@dataclass(frozen=True)
class Spread:
    """At most cap[c, g] replicas of class c in the pools of group g (a provider, a region)."""

    group: np.ndarray  # P, int: the group of each pool
    cap: np.ndarray  # C x G, inf where unlimited


@dataclass(frozen=True)
class Problem:
    cost: np.ndarray  # C x P, $/GPU-hour, inf where the class may not use the pool
    sizes: np.ndarray  # C, GPUs per replica
    demand: np.ndarray  # C, replicas to place
    spot_cap: np.ndarray  # C, spot replicas allowed (summed over the class's deployments)
    priority_rank: np.ndarray  # C, 0 = lowest priority present
    free: np.ndarray  # P, GPUs free
    is_spot: np.ndarray  # P, bool
    spread: tuple[Spread, ...] = ()


def _penalties(pr: Problem, finite: np.ndarray | None = None) -> np.ndarray:
    """Unplaced penalty per class; `finite`: np.isfinite(pr.cost) if the caller has it."""
    finite = np.isfinite(pr.cost) if finite is None else finite
    top = float(np.max(pr.cost[finite], initial=-np.inf))  # the same max, ~40 % faster
    base = 10.0 * (top + 1.0) if np.isfinite(top) else 10.0
    rank = np.minimum(pr.priority_rank, MAX_PRIORITY_LEVELS)
    return base * PRIORITY_STEP**rank


def _initial_columns(pr: Problem, upper: np.ndarray) -> np.ndarray:
    """Boolean C x P: each class's cheapest admissible pools covering COVER x its demand
    (every admissible pair when there are few)."""
    if np.count_nonzero(upper) <= ALL_COLUMNS:  # one dual simplex run beats several rounds
        return upper > 0
    chosen = np.zeros(pr.cost.shape, dtype=bool)
    for c in range(len(pr.sizes)):
        idx = np.flatnonzero(upper[c] > 0)
        if not len(idx) or pr.demand[c] <= 0:
            continue
        idx = idx[np.argsort(pr.cost[c, idx], kind="stable")]
        cover = np.cumsum(upper[c, idx])
        n = int(np.searchsorted(cover, COVER * pr.demand[c])) + 1
        chosen[c, idx[: max(n, MIN_COLUMNS)]] = True
    return chosen


def silent_highs() -> Any:
    """A HiGHS solver that prints nothing.

    highspy's `Highs()` wrapper installs a log callback in its constructor, which prints
    the banner to stdout before any option can be set; the core class it wraps does not,
    so output is switched off before anything can be logged.
    """
    from highspy._core import _Highs

    h = _Highs()
    h.setOptionValue("output_flag", False)
    return h


@dataclass(frozen=True)
class _Cuts:
    """Divisibility cut rows: row[k, p] (or -1) for divisor k; divides[c, k]: S_k | size_c."""

    row: np.ndarray  # K x P, int64
    bound: np.ndarray  # one upper bound per cut row, in row order
    divides: np.ndarray  # C x K, bool


def _cuts(pr: Problem, first_row: int) -> _Cuts:
    free = np.maximum(pr.free, 0)
    divisors = sorted({int(s) for s in pr.sizes if s > 1})
    row = np.full((len(divisors), len(free)), -1, dtype=np.int64)
    bounds: list[np.ndarray] = []
    n = first_row
    for k, size in enumerate(divisors):
        pools = np.flatnonzero(free % size != 0)
        row[k, pools] = n + np.arange(len(pools))
        bounds.append(size * (free[pools] // size))
        n += len(pools)
    divides = np.array([[int(s) % d == 0 for d in divisors] for s in pr.sizes], dtype=bool)
    bound = np.concatenate(bounds) if bounds else np.zeros(0, dtype=np.int64)
    return _Cuts(row, bound, divides.reshape(len(pr.sizes), len(divisors)))


def _by_group(m: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Row sums of the C x P matrix m within each group of pools: C x n_groups."""
    out = np.zeros((m.shape[0], n_groups))
    for c in range(m.shape[0]):
        out[c] = np.bincount(group, weights=m[c], minlength=n_groups)
    return out


def _spread_rows(sp: Spread, upper: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """Row index per (class, group) whose cap binds (else -1), and the caps in row order."""
    room = _by_group(upper, sp.group, sp.cap.shape[1])  # most the class fits in each group
    cs, gs = np.nonzero(sp.cap < room)
    row = np.full(sp.cap.shape, -1, dtype=np.int64)
    row[cs, gs] = first + np.arange(len(cs))
    return row, sp.cap[cs, gs]


class _Model:
    """The HiGHS model; rows: classes, pools, per-class spot rows, divisibility cuts."""

    def __init__(self, pr: Problem, upper: np.ndarray, whole: bool = False) -> None:
        import highspy

        self.hs = highspy
        self.pr = pr
        self.upper = upper
        self.n_c, self.n_p = pr.cost.shape
        self.cols_c = np.zeros(0, dtype=np.int64)
        self.cols_p = np.zeros(0, dtype=np.int64)
        h = silent_highs()
        h.setOptionValue("threads", 1)
        h.setOptionValue("presolve", "off")  # small, sparse models: presolve costs more
        if whole:  # a MIP: bounded by nodes (never by time), stops at a tiny gap
            h.setOptionValue("mip_max_nodes", MIP_NODES)
            h.setOptionValue("mip_rel_gap", MIP_GAP)
            for heuristic in ("rins", "rens", "root_reduced_cost"):  # sub-MIPs: slow here
                h.setOptionValue(f"mip_heuristic_run_{heuristic}", False)
        else:
            h.setOptionValue("simplex_iteration_limit", ITERATION_LIMIT)
        self.whole = whole
        inf = highspy.kHighsInf
        n_c = self.n_c
        self.cuts = _cuts(pr, 2 * n_c + self.n_p)
        first = 2 * n_c + self.n_p + len(self.cuts.bound)
        self.spread_rows: list[np.ndarray] = []  # per Spread: C x G row index or -1
        bounds = [pr.demand, pr.free, pr.spot_cap, self.cuts.bound]
        for sp in pr.spread:
            row, bound = _spread_rows(sp, upper, first)
            self.spread_rows.append(row)
            bounds.append(bound)
            first += len(bound)
        upper_rows = np.concatenate(bounds).astype(float)
        n_rows = len(upper_rows)
        lower = np.concatenate([pr.demand, np.full(n_rows - n_c, -inf)]).astype(float)
        empty = np.zeros(0, dtype=np.int32)
        h.addRows(n_rows, lower, upper_rows, 0, np.zeros(n_rows, np.int32), empty, np.zeros(0))
        penalty = _penalties(pr) * pr.sizes
        starts = np.arange(n_c, dtype=np.int32)
        h.addCols(
            n_c,
            penalty.astype(float),
            np.zeros(n_c),
            np.full(n_c, inf),
            n_c,
            starts,
            np.arange(n_c, dtype=np.int32),
            np.ones(n_c),
        )
        self.h = h

    def add(self, cs: np.ndarray, ps: np.ndarray) -> None:
        pr = self.pr
        n = len(cs)
        if not n:
            return
        j = np.arange(n)
        size = pr.sizes[cs].astype(float)
        spot = np.flatnonzero(pr.is_spot[ps])
        cols = [j, j, spot]
        rows = [cs, self.n_c + ps, self.n_c + self.n_p + cs[spot]]
        vals = [np.ones(n), size, np.ones(len(spot))]
        for k in range(len(self.cuts.row)):
            row = self.cuts.row[k, ps]
            on = np.flatnonzero((row >= 0) & self.cuts.divides[cs, k])
            cols.append(on)
            rows.append(row[on])
            vals.append(size[on])
        for sp, sp_rows in zip(self.pr.spread, self.spread_rows, strict=True):
            row = sp_rows[cs, sp.group[ps]]
            on = np.flatnonzero(row >= 0)
            cols.append(on)
            rows.append(row[on])
            vals.append(np.ones(len(on)))
        col, row, val = (np.concatenate(a) for a in (cols, rows, vals))
        order = np.lexsort((row, col))
        starts = np.searchsorted(col[order], j).astype(np.int32)
        index = row[order].astype(np.int32)
        cost = pr.sizes[cs] * pr.cost[cs, ps]
        self.h.addCols(
            n,
            cost,
            np.zeros(n),
            self.upper[cs, ps].astype(float),
            len(index),
            starts,
            index,
            val[order],
        )
        if self.whole:
            first = self.n_c + len(self.cols_c)
            cols = np.arange(first, first + n, dtype=np.int32)
            self.h.changeColsIntegrality(n, cols, np.ones(n, dtype=np.uint8))
        self.cols_c = np.concatenate([self.cols_c, cs])
        self.cols_p = np.concatenate([self.cols_p, ps])

    def run(self) -> bool:
        self.h.run()
        if self.whole:  # a node limit still leaves a whole-replica solution to use
            return self.h.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
        return self.h.getModelStatus() == self.hs.HighsModelStatus.kOptimal

    def entering(self, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Absent columns with a negative reduced cost under the current duals."""
        rc, y_c = self.reduced_costs()
        bad = (rc < -TOL * (1.0 + np.abs(y_c[:, None]))) & (self.upper > 0) & ~present
        rc = np.where(bad, rc, np.inf)
        k = min(ENTER_PER_CLASS, self.n_p)
        best = np.argpartition(rc, k - 1, axis=1)[:, :k]
        cs = np.repeat(np.arange(self.n_c), k)
        ps = best.ravel()
        keep = np.isfinite(rc[cs, ps])
        return cs[keep], ps[keep]

    def reduced_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """C x P reduced costs of every (class, pool) under the current duals, and the
        class rows' duals."""
        pr = self.pr
        y = np.asarray(self.h.getSolution().row_dual)
        n_c, n_p = self.n_c, self.n_p
        y_c, y_p = y[:n_c], y[n_c : n_c + n_p]
        y_s = y[n_c + n_p : 2 * n_c + n_p]
        rows = self.cuts.row
        y_cut = np.where(rows >= 0, y[np.maximum(rows, 0)], 0.0)  # K x P
        y_pool = y_p[None, :] + self.cuts.divides.astype(float) @ y_cut  # C x P
        with np.errstate(invalid="ignore"):
            rc = pr.sizes[:, None] * (pr.cost - y_pool) - y_c[:, None]
            rc -= np.where(pr.is_spot[None, :], y_s[:, None], 0.0)
        for sp, sp_rows in zip(pr.spread, self.spread_rows, strict=True):
            rc -= np.where(sp_rows >= 0, y[np.maximum(sp_rows, 0)], 0.0)[:, sp.group]
        return rc, y_c

    def solution(self) -> np.ndarray:
        x = np.asarray(self.h.getSolution().col_value)[self.n_c :]
        out = np.zeros((self.n_c, self.n_p))
        out[self.cols_c, self.cols_p] = x
        return out


def _upper(pr: Problem) -> np.ndarray:
    """Most replicas of class c that pool p can take: room, spot budget, demand."""
    with np.errstate(invalid="ignore"):
        upper = np.where(
            np.isfinite(pr.cost), np.maximum(pr.free, 0)[None, :] // pr.sizes[:, None], 0
        )
    upper = np.where(pr.is_spot[None, :], np.minimum(upper, pr.spot_cap[:, None]), upper)
    return np.minimum(upper, np.maximum(pr.demand, 0)[:, None])


def solve(pr: Problem, rounding_mip: bool = True) -> np.ndarray | None:
    """Replica quotas C x P (integral, within free capacity and spot caps), or None.
    Without `rounding_mip` the quotas are floor(x)."""
    try:
        import highspy  # noqa: F401
    except ImportError:  # pragma: no cover - highspy is a dependency; greedy fallback
        return None
    upper = _upper(pr)
    model = _Model(pr, upper)
    present = _initial_columns(pr, upper)
    model.add(*np.nonzero(present))
    for _ in range(MAX_ROUNDS):
        if not model.run():
            return None
        cs, ps = model.entering(present)
        if not len(cs):
            break
        present[cs, ps] = True
        model.add(cs, ps)
    # after MAX_ROUNDS: feasible, perhaps not optimal
    if not rounding_mip:
        return np.floor(model.solution() + 1e-6).astype(np.int64)
    return _whole(pr, model.solution(), model.reduced_costs()[0])


def _whole(pr: Problem, x: np.ndarray, rc: np.ndarray) -> np.ndarray:
    """Whole replicas from the LP's x: kept where x is whole; the pools where the LP split a
    replica (few, thanks to the cuts) are re-solved as a small MIP, together with the room
    left in each class's MIP_POOLS pools of least reduced cost (where the LP would put
    more next). floor(x) if that MIP finds nothing."""
    quotas = np.floor(x + 1e-6).astype(np.int64)
    split: np.ndarray = np.any(x - quotas > 1e-6, axis=0)
    if not split.any():
        return quotas
    fixed = np.where(split[None, :], 0, quotas)
    rest = _remainder(pr, fixed)
    upper = _upper(rest)
    rc = np.where(upper > 0, np.nan_to_num(rc, nan=np.inf, posinf=np.inf), np.inf)
    k = min(MIP_POOLS, rc.shape[1])
    near = np.zeros(rc.shape, dtype=bool)
    np.put_along_axis(near, np.argpartition(rc, k - 1, axis=1)[:, :k], True, axis=1)
    columns = (upper > 0) & (near | split[None, :])
    pools = np.flatnonzero(columns.any(axis=0))  # the MIP sees only these pools
    model = _Model(_restricted(rest, pools), upper[:, pools], whole=True)
    model.add(*np.nonzero(columns[:, pools]))
    if not model.run():
        return quotas
    fixed[:, pools] += np.floor(model.solution() + 0.5).astype(np.int64)
    return fixed


def _restricted(pr: Problem, pools: np.ndarray) -> Problem:
    """The same problem on a subset of the pools."""
    return Problem(
        cost=pr.cost[:, pools],
        sizes=pr.sizes,
        demand=pr.demand,
        spot_cap=pr.spot_cap,
        priority_rank=pr.priority_rank,
        free=pr.free[pools],
        is_spot=pr.is_spot[pools],
        spread=tuple(Spread(sp.group[pools], sp.cap) for sp in pr.spread),
    )


def _remainder(pr: Problem, fixed: np.ndarray) -> Problem:
    """The problem left once the replicas in `fixed` are placed."""
    spread = []
    for sp in pr.spread:
        spread.append(Spread(sp.group, sp.cap - _by_group(fixed, sp.group, sp.cap.shape[1])))
    return Problem(
        cost=pr.cost,
        sizes=pr.sizes,
        demand=pr.demand - fixed.sum(axis=1),
        spot_cap=pr.spot_cap - fixed[:, pr.is_spot].sum(axis=1),
        priority_rank=pr.priority_rank,
        free=pr.free - fixed.T @ pr.sizes,
        is_spot=pr.is_spot,
        spread=tuple(spread),
    )
