"""place() and replan(): the phases of a placement, in order.

1. keep: current replicas stay where they are if still admissible (churn: a stable input
   moves nothing); surplus replicas and over-committed pools are trimmed, cheapest kept.
2. quotas: a class-level LP (transport.py: divisibility cuts, spread caps, priority
   penalties) and a small MIP over the pools it split give whole-replica quotas per
   (class, pool); above MAX_CLASSES (100) classes a min-cost flow in GPUs (network.py,
   LEMON's network simplex, the divisibility cuts as a chain of per-pool size nodes, so
   its unplaced GPUs equal the whole-replica optimum on the bench's families) gives them
   instead, cut into whole replicas per pool; the LP on merged classes x pool groups
   (coarse.py) only if that solver is missing or fails.
   Seed 7, 92 %, CPU s of place() on a shared machine (docs/placement.md, "Status"): 60
   shapes 0.5-0.7 s at the optimum; 300 shapes 0.5-0.9 s, 2227 unplaced (= the optimum);
   1,000 shapes 0.6-1.0 s, 2735 (the LP bound 2731); one per deployment 0.8-0.9 s since
   session 14 (1.0-1.4 s before), 2682 (bound 2674): see docs/placement.md for what is
   left.
3. fill: deployments in order (priority, then scarcest compatible capacity first, then
   bigger replicas first) take their class's quotas, spread-needing ones first spanning
   their providers/regions; a second LP and fill place what that left.
4. repair: replicas still unplaced make room by moving others (make_room) or, if of
   higher priority, by displacing lower-priority replicas; displaced ones are re-homed.
5. improve: spot fraction and spread are enforced; replicas move into cheaper pools with
   room (kept ones only if the saving beats the churn cost); two replicas of one size
   swap pools where that saves (`swap`: the cheap pools are full, so moving one replica
   into room cannot reach them); a last fill tops up.
Deterministic: every choice breaks ties by index, no randomness, no clock.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from controlplane.placement import coarse, network, transport
from controlplane.placement.constraints import Tables, compile_tables
from controlplane.placement.flow import MAX_CLASSES, ClassFlow
from controlplane.placement.incremental import replan_deployments
from controlplane.placement.model import Assignment, PlacementInput, PlacementResult
from controlplane.placement.packing import (
    Plan,
    drop_most_expensive,
    fill,
)
from controlplane.placement.repair import (
    enforce_rules,
    place_again,
    place_hard,
    place_short,
    rehome_displaced,
    swap_and_improve,
)
from controlplane.placement.result import (
    EngineState,
    Slots,
    assemble,
    deployment_output,
    index_current,
    procurement,
    removed_deployment_changes,
)


def keep_deployment(plan: Plan, d: int, slots: dict[tuple[str, int], int]) -> None:
    """Keep d's admissible current replicas ((cluster, pool index) -> n), cheapest first."""
    t = plan.t
    for (cluster, p), n in sorted(slots.items()):
        if n > 0 and cluster in t.healthy_clusters[p] and t.compat(d)[p]:
            plan.add(d, p, n)
            plan.kept[d][p] = plan.kept[d].get(p, 0) + n
    surplus = plan.placed(d) - t.inp.deployments[d].target_replicas
    if surplus > 0:
        drop_most_expensive(plan, d, surplus)


def keep_current(plan: Plan, current: tuple[Assignment, ...]) -> None:
    """Phase 1: keep admissible current replicas, trim surplus and over-committed pools."""
    t = plan.t
    by_dep: dict[int, dict[tuple[str, int], int]] = {}
    for a in current:
        d, p = t.dep_index.get(a.deployment), t.pool_index.get(a.pool)
        if d is not None and p is not None:
            slots = by_dep.setdefault(d, {})
            slots[(a.cluster, p)] = slots.get((a.cluster, p), 0) + a.replicas
    for d in sorted(by_dep):
        keep_deployment(plan, d, by_dep[d])
    deps = t.inp.deployments
    for p in np.flatnonzero(plan.used > t.cap):
        p = int(p)
        for d in sorted(plan.members[p], key=lambda d: (deps[d].priority, -plan.size(d), d)):
            while d in plan.members[p] and plan.used[p] > t.cap[p]:
                plan.remove(d, p, 1)


def placement_order(t: Tables, plan: Plan) -> list[int]:
    """Priority first; then scarcest compatible capacity; then bigger replicas first."""
    deps = t.inp.deployments
    demand: dict[int, float] = {}
    groups: list[int] = []
    for d, dep in enumerate(deps):
        g = id(t.compat(d))  # equal policies share one cached mask
        groups.append(g)
        demand[g] = demand.get(g, 0.0) + dep.target_replicas * dep.gpus_per_replica
    supply = {g: 0.0 for g in demand}
    for d in range(len(deps)):
        g = groups[d]
        if supply[g] == 0.0:
            supply[g] = float(t.cap[t.compat(d)].sum()) or 1e-9
    tight = [demand[groups[d]] / supply[groups[d]] for d in range(len(deps))]
    return sorted(
        range(len(deps)),
        key=lambda d: (
            -deps[d].priority,
            -round(tight[d], 1),
            -deps[d].gpus_per_replica,
            -max(deps[d].policy.min_distinct_providers, deps[d].policy.min_distinct_regions),
            d,
        ),
    )


def _classes(plan: Plan, order: list[int]) -> list[list[int]]:
    """Deployments with missing replicas grouped by (size, admissible pools, cost row).

    Priority is not part of the key: within a class the fill serves higher priority first,
    across classes place_hard displaces lower priority.
    """
    t = plan.t
    deps = t.inp.deployments
    classes: dict[tuple[int, int, int], int] = {}
    members: list[list[int]] = []
    for d in order:
        if deps[d].target_replicas - plan.placed(d) > 0:
            dep = deps[d]
            key = (dep.gpus_per_replica, id(t.compat(d)), id(t.cost(d)))
            c = classes.setdefault(key, len(classes))
            if c == len(members):
                members.append([])
            members[c].append(d)
    return members


def assign_quotas(plan: Plan, order: list[int]) -> None:
    """Solve the class-level transportation LP for the missing replicas; hand out quotas."""
    t = plan.t
    deps = t.inp.deployments
    members = _classes(plan, order)
    if not members:
        return
    n_pool = len(t.pool_ids)
    cost = np.full((len(members), n_pool), np.inf)
    demand = np.zeros(len(members), dtype=np.int64)
    spot = np.zeros(len(members), dtype=np.int64)
    for c, ds in enumerate(members):
        d0 = ds[0]
        cost[c] = np.where(t.compat(d0), t.cost(d0), np.inf)
        for d in ds:
            demand[c] += deps[d].target_replicas - plan.placed(d)
            spot[c] += max(plan.spot_budget(d), 0)
    sizes = np.array([deps[ds[0]].gpus_per_replica for ds in members], dtype=np.int64)
    top = [max(deps[d].priority for d in ds) for ds in members]  # class's highest priority
    levels = sorted(set(top))
    rank = np.array([levels.index(p) for p in top], dtype=np.int64)
    free = t.cap - plan.used
    spread = (
        transport.Spread(t.pool_provider, _spread_caps(plan, members, "providers")),
        transport.Spread(t.pool_region, _spread_caps(plan, members, "regions")),
    )
    problem = transport.Problem(cost, sizes, demand, spot, rank, free, t.is_spot.copy(), spread)
    if len(members) > MAX_CLASSES:  # a min-cost flow in GPUs (network.py)
        of = np.arange(len(members))
        quotas = network.solve(problem, t.unit_cost, t.pool_region)
        if quotas is None:  # no flow solver: merged classes x pool groups (coarse.py)
            of, n_merged = coarse.merged_classes([_merge_key(t, ds[0]) for ds in members])
            quotas = coarse.solve(problem, of, n_merged)
            if quotas is None:
                return
    else:
        of = np.arange(len(members))
        quotas = transport.solve(problem)
        if quotas is None:
            quotas = _greedy_quotas(cost, sizes, demand, spot, rank, free, t.is_spot)
    merged_size = np.zeros(len(quotas), dtype=np.int64)
    merged_size[of[::-1]] = sizes[::-1]  # a merged class's size: its first class's
    plan.reserved = merged_size @ quotas
    rows, cols = np.nonzero(quotas > 0)
    bounds = np.searchsorted(rows, np.arange(len(quotas) + 1))
    for c, ds in enumerate(members):
        held = cols[bounds[of[c]] : bounds[of[c] + 1]]
        held = held[t.compat(ds[0])[held]]  # members share their admissible pools
        for d in ds:
            plan.quota[d] = quotas[of[c]]  # one array per merged class: members share it
            plan.quota_pools[d] = held


MERGE_COST_STEP = 0.05  # $/GPU-hour: merged classes' location costs differ by less


def _merge_key(t: Tables, d: int) -> tuple:
    """Classes the coarse LP merges: same size and admissible pools, and location costs
    (the traffic's latency term) within about MERGE_COST_STEP of each other."""
    where = np.round((t.cost(d) - t.unit_cost) / MERGE_COST_STEP).astype(np.int64)
    return (t.inp.deployments[d].gpus_per_replica, t.compat(d).tobytes(), where.tobytes())


def _spread_caps(plan: Plan, members: list[list[int]], kind: str) -> np.ndarray:
    """Most replicas each class may put on one provider (region): C x G, inf if unlimited.

    A member asking for k distinct ones with target n holds at most n - min(k, n) + 1 on
    one of them once fully placed (less what it already holds there), so that it can
    still reach the other k - 1; the class's cap is the sum over its members.
    """
    t = plan.t
    deps = t.inp.deployments
    key = t.pool_provider if kind == "providers" else t.pool_region
    n_groups = len(t.providers) if kind == "providers" else len(t.region_index)
    caps = np.full((len(members), n_groups), np.inf)
    for c, ds in enumerate(members):
        pol = deps[ds[0]].policy
        want = pol.min_distinct_providers if kind == "providers" else pol.min_distinct_regions
        if want < 2:
            continue
        row = np.zeros(n_groups)
        for d in ds:
            n = deps[d].target_replicas
            missing = n - plan.placed(d)
            most = n - min(want, n) + 1
            row += min(missing, most)
            held: dict[int, int] = {}
            for p, k in plan.alloc[d].items():
                held[int(key[p])] = held.get(int(key[p]), 0) + k
            for g, k in held.items():
                row[g] += min(missing, max(0, most - k)) - min(missing, most)
        caps[c] = row
    return caps


def _greedy_quotas(cost, sizes, demand, spot, rank, free, is_spot) -> np.ndarray:
    """Fallback when the LP does not finish: scarcest-first greedy plus cycle cancelling."""
    scarcity = np.array([free[np.isfinite(row)].sum() for row in cost], dtype=float)
    order = np.lexsort((scarcity, -rank)).argsort()
    flow = ClassFlow(cost, demand * sizes, free, is_spot, spot * sizes, order, sizes)
    flow.solve()
    return flow.f // sizes[:, None]


def solve(plan: Plan, order: list[int]) -> None:
    """Phases 2-4 on a plan that already holds the kept replicas."""
    deps = plan.t.inp.deployments
    spreading = [
        d
        for d in order
        if max(deps[d].policy.min_distinct_providers, deps[d].policy.min_distinct_regions) > 1
    ]
    # LP quotas, then a second LP for what rounding and the spread rule left over
    for last in (False, True):
        assign_quotas(plan, order)
        for first in (True, False):  # every member spreads before any takes the rest
            for d in spreading if first else order:
                missing = deps[d].target_replicas - plan.placed(d)
                if missing > 0:
                    fill(plan, d, missing, only_quota=not last, spread_first=first)
        plan.quota.clear()
        plan.quota_pools.clear()
        plan.reserved = None
    for d in order:
        missing = deps[d].target_replicas - plan.placed(d)
        if missing > 0:
            place_hard(plan, d, missing)
    rehome_displaced(plan)
    place_again(plan, enforce_rules(plan, order))
    swap_and_improve(plan, order)
    top_up(plan, order)


def top_up(plan: Plan, order: list[int]) -> None:
    """Last chance for short deployments on the room left after improve and enforcement;
    those above the lowest priority may evict once more: improve or a swap may have moved
    a lower priority into room they could take, which a re-plan would then evict.

    Leaves nothing a re-plan of the same input could still add, so that an unchanged
    input moves nothing and adds nothing.
    """
    plan.no_room.clear()  # improve and swap moved replicas: room found lacking may be there
    place_again(plan, order)
    place_short(plan, order, fill)


def _removed(inp: PlacementInput, current: dict[str, Slots]) -> tuple:
    names = {d.name for d in inp.deployments}
    return tuple(
        c
        for name in sorted(current)
        if name not in names
        for c in removed_deployment_changes(name, current[name])
    )


def place(inp: PlacementInput) -> PlacementResult:
    """Full re-plan of `inp` against `inp.current`. Raises PlacementInputError on bad input."""
    t = compile_tables(inp)
    plan = Plan.empty(t)
    keep_current(plan, inp.current)
    order = placement_order(t, plan)
    solve(plan, order)
    current = index_current(inp.current)
    outs = [
        deployment_output(plan, d, current.get(dep.name, {}))
        for d, dep in enumerate(inp.deployments)
    ]
    state = EngineState(inp, plan, outs, order, buys=procurement(plan))
    return assemble(state, _removed(inp, current))


def replan(previous: PlacementResult, inp: PlacementInput) -> PlacementResult:
    """Incremental re-plan: `previous` is the current placement and the warm start.

    When only deployments changed (pools, clusters, regions and weights are equal), only
    the changed deployments are re-placed (plus retries of replicas left unplaced), which
    takes milliseconds; otherwise it is place(inp) with current = previous.assignments.
    `inp.current` is ignored: the previous result is the current placement.
    """
    state = previous.state
    if not isinstance(state, EngineState) or not _same_world(state.inp, inp):
        return place(replace(inp, current=previous.assignments))
    return replan_deployments(state, inp)


def _same_world(a: PlacementInput, b: PlacementInput) -> bool:
    return (
        a.pools == b.pools
        and a.clusters == b.clusters
        and a.regions == b.regions
        and a.weights == b.weights
    )
