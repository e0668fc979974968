"""Turns a finished Plan into output: assignments with clusters, changes, procurement, cost.

Per-deployment pieces (DeploymentOutput) are built separately so an incremental re-plan
rebuilds only the deployments it touched and reuses the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from controlplane.placement.explain import explain
from controlplane.placement.model import (
    Assignment,
    Change,
    PlacementInput,
    PlacementResult,
    Procurement,
    Unplaced,
)
from controlplane.placement.packing import Plan

Slots = dict[tuple[str, str], int]  # (cluster, pool) -> replicas


@dataclass(frozen=True, slots=True)
class DeploymentOutput:
    assignments: tuple[Assignment, ...]
    changes: tuple[Change, ...]
    unplaced: tuple[Unplaced, ...]
    cost: float  # list price $/hour
    objective: float  # effective $/hour


def index_current(current: Iterable[Assignment]) -> dict[str, Slots]:
    out: dict[str, Slots] = {}
    for a in current:
        slots = out.setdefault(a.deployment, {})
        key = (a.cluster, a.pool)
        slots[key] = slots.get(key, 0) + a.replicas
    return out


def _split_clusters(plan: Plan, d: int, p: int, n: int, cur: Slots) -> list[tuple[str, int]]:
    """Spread n replicas over the pool's healthy clusters, keeping current ones first."""
    pid = plan.t.pool_ids[p]
    healthy = plan.t.healthy_clusters[p]
    out: list[tuple[str, int]] = []
    for c in healthy:
        have = cur.get((c, pid), 0)
        if have and n:
            take = min(have, n)
            out.append((c, take))
            n -= take
    if n:
        if out:
            out[0] = (out[0][0], out[0][1] + n)
        else:
            out.append((healthy[0], n))
    return out


def _changes(name: str, old: Slots, new: Slots) -> tuple[Change, ...]:
    removed = sorted((k, n - new.get(k, 0)) for k, n in old.items() if n > new.get(k, 0))
    added = sorted((k, n - old.get(k, 0)) for k, n in new.items() if n > old.get(k, 0))
    out: list[Change] = []
    i = j = 0
    while i < len(removed) and j < len(added):
        (fc, fp), rn = removed[i]
        (tc, tp), an = added[j]
        n = min(rn, an)
        out.append(Change("move", name, n, fc, fp, tc, tp))
        removed[i] = ((fc, fp), rn - n)
        added[j] = ((tc, tp), an - n)
        i += removed[i][1] == 0
        j += added[j][1] == 0
    out += [Change("remove", name, n, c, p) for (c, p), n in removed[i:] if n]
    out += [Change("add", name, n, None, None, c, p) for (c, p), n in added[j:] if n]
    return tuple(out)


def deployment_output(plan: Plan, d: int, cur: Slots) -> DeploymentOutput:
    t = plan.t
    dep = t.inp.deployments[d]
    s = dep.gpus_per_replica
    new: Slots = {}
    cost = objective = 0.0
    row = t.cost(d)
    alloc = plan.alloc[d]
    for p in sorted(alloc):
        n = alloc[p]
        cost += n * s * float(t.price[p])
        objective += n * s * float(row[p])
        if not cur and n:  # nothing current to keep: all on the first healthy cluster
            new[(t.healthy_clusters[p][0], t.pool_ids[p])] = n
            continue
        for c, k in _split_clusters(plan, d, p, n, cur):
            new[(c, t.pool_ids[p])] = k
    assignments = tuple(Assignment(dep.name, c, pid, n) for (c, pid), n in sorted(new.items()))
    return DeploymentOutput(
        assignments, _changes(dep.name, cur, new), explain(plan, d), round(cost, 6), objective
    )


def removed_deployment_changes(name: str, cur: Slots) -> tuple[Change, ...]:
    return _changes(name, cur, {})


def _buy(plan: Plan, p: int) -> Procurement | None:
    """GPUs to buy in pool p: what the plan uses beyond capacity, in whole instances."""
    need = int(plan.used[p] - plan.t.capacity[p])
    if need <= 0:
        return None
    pool = plan.t.inp.pools[p]
    gpi = pool.gpus_per_instance
    gpus = min(math.ceil(need / gpi) * gpi, pool.procurable_gpus)
    return Procurement(pool.id, gpus, math.ceil(gpus / gpi))


def procurement(
    plan: Plan, previous: dict[int, Procurement] | None = None, prev_used: np.ndarray | None = None
) -> dict[int, Procurement]:
    """Procurement per pool index; with `previous`, only pools whose usage changed are redone."""
    if previous is None or prev_used is None:
        pools = np.flatnonzero(plan.used > plan.t.capacity)
        out: dict[int, Procurement] = {}
    else:
        pools = np.flatnonzero(plan.used != prev_used)
        out = dict(previous)
    for p in pools.tolist():
        buy = _buy(plan, p)
        if buy is None:
            out.pop(p, None)
        else:
            out[p] = buy
    return out


@dataclass
class EngineState:
    """What replan() needs from the previous result; opaque to callers.

    `fresh` lists the deployments whose `outputs[d].changes` are against this result's
    current placement (None: all); the others did not change and contribute no changes.
    """

    inp: PlacementInput
    plan: Plan
    outputs: list[DeploymentOutput]
    order: list[int]
    fresh: list[int] | None = None
    buys: dict[int, Procurement] = field(default_factory=dict)


def assemble(state: EngineState, extra_changes: tuple = ()) -> PlacementResult:
    outs = state.outputs
    cost = {d.name: o.cost for d, o in zip(state.inp.deployments, outs, strict=True)}
    fresh = outs if state.fresh is None else [outs[d] for d in state.fresh]
    return PlacementResult(
        assignments=tuple(chain.from_iterable(o.assignments for o in outs)),
        changes=tuple(chain.from_iterable(o.changes for o in fresh)) + extra_changes,
        procurement=tuple(state.buys[p] for p in sorted(state.buys)),
        unplaced=tuple(chain.from_iterable(o.unplaced for o in outs)),
        cost_per_hour=cost,
        total_cost_per_hour=round(sum(cost.values()), 6),
        objective_per_hour=round(sum(o.objective for o in outs), 6),
        state=state,
    )
