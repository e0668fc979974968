"""Incremental re-plan when only deployments changed: touch only what changed.

The previous plan (pool usage, per-deployment allocations) is copied, changed and removed
deployments give their replicas back, changed and new ones are re-kept (if still
admissible) and filled, replicas left unplaced before are retried, and only deployments
whose allocation moved get a fresh output. The previous result stays untouched.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from controlplane.placement.model import PlacementInput, PlacementResult
from controlplane.placement.packing import (
    Plan,
    drop_most_expensive,
    fill,
)
from controlplane.placement.repair import (
    enforce_rules,
    improve,
    place_again,
    place_hard,
    rehome_displaced,
)
from controlplane.placement.result import (
    EngineState,
    Slots,
    assemble,
    deployment_output,
    procurement,
    removed_deployment_changes,
)


def _copy_plan(state: EngineState, inp: PlacementInput) -> tuple[Plan, list[int | None]]:
    """New plan over the new deployment list; old_of[d] is d's index in the old list."""
    old = state.plan
    t_old = old.t
    dep_index = {d.name: i for i, d in enumerate(inp.deployments)}
    old_of = [t_old.dep_index.get(d.name) for d in inp.deployments]
    t = replace(t_old, inp=inp, dep_index=dep_index, _masks={}, _costs={})
    same_order = old_of == list(range(len(t_old.inp.deployments)))
    for d, o in enumerate(old_of):
        if o is not None and inp.deployments[d] is t_old.inp.deployments[o]:
            if o in t_old._masks:
                t._masks[d] = t_old._masks[o]
            if o in t_old._costs:
                t._costs[d] = t_old._costs[o]
    if same_order:  # share the dicts; Plan copies one on its first write
        plan = Plan(
            t=t,
            used=old.used.copy(),
            alloc=list(old.alloc),
            members=list(old.members),
            kept=list(old.alloc),
            shared=True,
        )
    else:
        plan = Plan(
            t=t,
            used=old.used.copy(),
            alloc=[dict(old.alloc[o]) if o is not None else {} for o in old_of],
            members=[{} for _ in old.members],
            kept=[dict(old.alloc[o]) if o is not None else {} for o in old_of],
        )
        for d, a in enumerate(plan.alloc):
            for p, n in a.items():
                plan.members[p][d] = n
    new_of = {o: d for d, o in enumerate(old_of) if o is not None}
    plan.blocked = {new_of[o]: b for o, b in old.blocked.items() if o in new_of}
    plan.displaced = {
        new_of[o]: {new_of[b]: n for b, n in by.items() if b in new_of}
        for o, by in copy.deepcopy(old.displaced).items()
        if o in new_of
    }
    return plan, old_of


def _release_removed(plan: Plan, state: EngineState, old_of: list[int | None]) -> None:
    """Give back the GPUs of deployments that no longer exist."""
    old = state.plan
    alive = {o for o in old_of if o is not None}
    for o, a in enumerate(old.alloc):
        if o not in alive:
            for p, n in a.items():
                plan.used[p] -= n * old.size(o)
                plan.freed(p)


def replan_deployments(state: EngineState, inp: PlacementInput) -> PlacementResult:
    plan, old_of = _copy_plan(state, inp)
    _release_removed(plan, state, old_of)
    t_old = state.plan.t
    changed = [
        d
        for d, o in enumerate(old_of)
        if o is None
        or (
            inp.deployments[d] is not t_old.inp.deployments[o]
            and inp.deployments[d] != t_old.inp.deployments[o]
        )
    ]
    for d in changed:
        slots = dict(plan.alloc[d])
        for p, n in slots.items():
            plan.remove(d, p, n)
        if plan.shared:
            plan.own_deps.add(d)
            plan.alloc[d] = dict(plan.alloc[d])
        plan.kept[d] = {}
        plan.blocked.pop(d, None)
        plan.displaced.pop(d, None)
        for p, n in sorted(slots.items()):
            if plan.t.compat(d)[p]:
                plan.add(d, p, n)
                plan.kept[d][p] = n
        surplus = plan.placed(d) - inp.deployments[d].target_replicas
        if surplus > 0:
            drop_most_expensive(plan, d, surplus)
    retry = _worth_retrying(plan, state, old_of, changed)
    _settle(plan, changed, retry)
    plan.touched.update(changed)  # a new target needs a new explanation even if nothing moved
    plan.touched.update(retry)
    return _outputs(plan, state, inp, old_of)


def _worth_retrying(
    plan: Plan, state: EngineState, old_of: list[int | None], changed: list[int]
) -> list[int]:
    """Unchanged deployments left short before that may fit now: only the pools the changes
    freed (used less than before) have more room than the last plan found, so one that may
    use none of them would be refused again (and cost a fill per unplaced replica)."""
    freed = plan.used < state.plan.used
    if not freed.any():
        return []
    skip = set(changed)
    return [
        d
        for d, o in enumerate(old_of)
        if o is not None
        and d not in skip
        and state.outputs[o].unplaced
        and bool((plan.t.compat(d) & freed).any())
    ]


def _settle(plan: Plan, changed: list[int], retry: list[int]) -> None:
    deps = plan.t.inp.deployments
    order = sorted(set(changed) | set(retry), key=lambda d: (-deps[d].priority, d))
    for d in order:
        missing = deps[d].target_replicas - plan.placed(d)
        if missing > 0:
            if d in changed:
                place_hard(plan, d, missing)
            else:
                fill(plan, d, missing)
    # displaced before and neither evicted again nor near a pool that gained room since
    # would find none again (the last plan's fill found none for them): not retried
    gained = plan.freed_at > 0
    t = plan.t
    rehome_displaced(
        plan, {e for e in plan.displaced if e in plan.touched or (t.compat(e) & gained).any()}
    )
    place_again(plan, [d for d in enforce_rules(plan, order) if d in changed])
    improve(plan, [d for d in order if d in changed], passes=1)


def _outputs(
    plan: Plan, state: EngineState, inp: PlacementInput, old_of: list[int | None]
) -> PlacementResult:
    outs = []
    fresh = []
    for d, o in enumerate(old_of):
        prev = state.outputs[o] if o is not None else None
        if prev is not None and d not in plan.touched:
            outs.append(prev)  # unchanged: contributes no changes (not in `fresh`)
            continue
        cur: Slots = {}
        if prev is not None:
            for a in prev.assignments:
                cur[(a.cluster, a.pool)] = a.replicas
        outs.append(deployment_output(plan, d, cur))
        fresh.append(d)
    alive = {o for o in old_of if o is not None}
    removed = tuple(
        c
        for o, out in enumerate(state.outputs)
        if o not in alive
        for c in removed_deployment_changes(
            state.inp.deployments[o].name,
            {(a.cluster, a.pool): a.replicas for a in out.assignments},
        )
    )
    order = sorted(range(len(inp.deployments)), key=lambda d: (-inp.deployments[d].priority, d))
    buys = procurement(plan, state.buys, state.plan.used)
    return assemble(EngineState(inp, plan, outs, order, fresh, buys), removed)
