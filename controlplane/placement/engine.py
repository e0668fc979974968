"""place() and replan(): the phases of a placement, in order.

1. keep: current replicas stay where they are if still admissible (churn: a stable input
   moves nothing); surplus replicas and over-committed pools are trimmed, cheapest kept.
2. fill: deployments in order (priority, then scarcest compatible capacity first, then
   bigger replicas first) take the cheapest pools with room, spreading first when the
   policy asks for several providers or regions.
3. repair: replicas still unplaced make room by moving others (make_room) or, if of
   higher priority, by displacing lower-priority replicas; displaced ones are re-homed.
4. improve: move replicas into cheaper pools with room (kept ones only if the saving
   beats the churn cost); then spot fraction and spread are enforced.
Deterministic: every choice breaks ties by index, no randomness, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from controlplane.placement.constraints import Tables, compile_tables
from controlplane.placement.model import Assignment, PlacementInput, PlacementResult
from controlplane.placement.packing import Plan, drop_most_expensive, enforce_spot
from controlplane.placement.packing import enforce_spread, fill
from controlplane.placement.repair import improve, place_hard, rehome_displaced
from controlplane.placement.result import (
    DeploymentOutput,
    Slots,
    deployment_output,
    index_current,
    procurement,
    removed_deployment_changes,
)


@dataclass
class EngineState:
    """What replan() needs from the previous result; opaque to callers."""

    inp: PlacementInput
    plan: Plan
    outputs: list[DeploymentOutput]
    order: list[int]


def keep_current(plan: Plan, current: tuple[Assignment, ...]) -> None:
    """Phase 1: keep admissible current replicas, trim surplus and over-committed pools."""
    t = plan.t
    for a in sorted(current, key=lambda a: (a.deployment, a.pool, a.cluster)):
        d, p = t.dep_index.get(a.deployment), t.pool_index.get(a.pool)
        if d is None or p is None or a.replicas <= 0:
            continue
        if a.cluster not in t.healthy_clusters[p] or not t.compat(d)[p]:
            continue
        plan.add(d, p, a.replicas)
        plan.kept[d][p] = plan.kept[d].get(p, 0) + a.replicas
    for d, dep in enumerate(t.inp.deployments):
        surplus = plan.placed(d) - dep.target_replicas
        if surplus > 0:
            drop_most_expensive(plan, d, surplus)
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
        key=lambda d: (-deps[d].priority, -round(tight[d], 1), -deps[d].gpus_per_replica, d),
    )


def solve(plan: Plan, order: list[int]) -> None:
    """Phases 2-4 on a plan that already holds the kept replicas."""
    deps = plan.t.inp.deployments
    short: list[int] = []
    for d in order:
        missing = deps[d].target_replicas - plan.placed(d)
        if missing > 0 and fill(plan, d, missing) < missing:
            short.append(d)
    for d in short:
        missing = deps[d].target_replicas - plan.placed(d)
        if missing > 0:
            place_hard(plan, d, missing)
    rehome_displaced(plan)
    improve(plan, order)
    for d in order:
        if plan.alloc[d]:
            enforce_spot(plan, d)
            enforce_spread(plan, d)


def _result(state: EngineState, extra_changes: tuple = ()) -> PlacementResult:
    outs = state.outputs
    cost = {d.name: o.cost for d, o in zip(state.inp.deployments, outs, strict=True)}
    return PlacementResult(
        assignments=tuple(a for o in outs for a in o.assignments),
        changes=tuple(c for o in outs for c in o.changes) + extra_changes,
        procurement=procurement(state.plan),
        unplaced=tuple(u for o in outs for u in o.unplaced),
        cost_per_hour=cost,
        total_cost_per_hour=round(sum(cost.values()), 6),
        objective_per_hour=round(sum(o.objective for o in outs), 6),
        state=state,
    )


def _removed(inp: PlacementInput, current: dict[str, Slots]) -> tuple:
    names = {d.name for d in inp.deployments}
    return tuple(
        c for name in sorted(current) if name not in names
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
    outs = [deployment_output(plan, d, current.get(dep.name, {}))
            for d, dep in enumerate(inp.deployments)]
    return _result(EngineState(inp, plan, outs, order), _removed(inp, current))


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
    from controlplane.placement.incremental import replan_deployments

    return replan_deployments(state, inp, _result)


def _same_world(a: PlacementInput, b: PlacementInput) -> bool:
    return (
        a.pools == b.pools
        and a.clusters == b.clusters
        and a.regions == b.regions
        and a.weights == b.weights
    )
