"""Why replicas stayed unplaced, in words a person can act on.

Each reason names the binding constraint (the first static constraint that leaves no pool,
else capacity / spread / spot fraction / priority), the pools that match, and ends with
"to fix: ...". Explanations are computed only for deployments with unplaced replicas.
"""

from __future__ import annotations

import itertools

import numpy as np

from controlplane.placement.model import Deployment, Unplaced
from controlplane.placement.packing import Plan

MAX_NAMED = 3  # pools named in a reason; the rest are counted


def _join(items: list[str], word: str = "or") -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} " + items[-1]


def _needs(dep: Deployment) -> str:
    pol = dep.policy
    parts = [f"{dep.gpus_per_replica}x {_join(sorted(dep.gpu_types))}"]
    if pol.required_certifications:
        parts.append(" and ".join(sorted(pol.required_certifications)))
    where = ""
    if pol.allowed_jurisdictions:
        where += f" in {_join(sorted(pol.allowed_jurisdictions))}"
    if pol.allowed_regions:
        where += f" in region {_join(sorted(pol.allowed_regions))}"
    return f"deployment `{dep.name}` needs " + " with ".join(parts) + where


def _pool_list(plan: Plan, mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask)
    order = idx[np.argsort(-(plan.t.cap[idx] - plan.used[idx]), kind="stable")]
    names = [f"`{plan.t.pool_ids[int(p)]}`" for p in order[:MAX_NAMED]]
    if len(idx) > MAX_NAMED:
        names.append(f"{len(idx) - MAX_NAMED} more")
    return "pool " + names[0] if len(names) == 1 else "pools " + _join(names, "and")


def _relax_hint(plan: Plan, stages: list[tuple[str, np.ndarray]]) -> str:
    """The policy constraint whose removal would free the most GPUs."""
    free = plan.t.cap - plan.used
    best, gain = "", 0
    for (_, before), (name, after) in itertools.pairwise(stages[:-1]):
        lost = int(free[before & ~after].sum())
        if lost > gain:
            best, gain = name, lost
    return f" or relax {best}" if best else " or accept more gpu_types"


def _static_reason(plan: Plan, dep: Deployment, stages: list[tuple[str, np.ndarray]]) -> Unplaced:
    head = _needs(dep)
    prev = stages[0][1]
    for name, mask in stages:
        if not mask.any():
            fix = {
                "gpu_types": "add a pool of that type with enough GPUs per instance",
                "cluster_health": "bring a cluster drawing on them back to healthy",
            }.get(name, f"relax {name}")
            have = f"; {_pool_list(plan, prev)} match all else" if prev.any() else ""
            return Unplaced(
                dep.name,
                0,
                dep.gpus_per_replica,
                name,
                f"{head}; no pool passes {name}{have}; to fix: {fix}",
            )
        prev = mask
    raise AssertionError("unreachable: some stage is empty")


def _capacity_reason(
    plan: Plan, dep: Deployment, stages: list[tuple[str, np.ndarray]], binding: str
) -> Unplaced:
    mask = stages[-1][1]
    head = _needs(dep)
    pools = _pool_list(plan, mask)
    pol = dep.policy
    if binding == "min_distinct_providers":
        msg = (
            f"{head} on {pol.min_distinct_providers} distinct providers; {pools} match but "
            "no other provider has room; to fix: add capacity at another provider or "
            "lower min_distinct_providers"
        )
    elif binding == "min_distinct_regions":
        msg = (
            f"{head} in {pol.min_distinct_regions} distinct regions; {pools} match but "
            "no other region has room; to fix: add capacity in another region or lower "
            "min_distinct_regions"
        )
    elif binding == "max_spot_fraction":
        msg = (
            f"{head} with at most {pol.max_spot_fraction:.0%} spot; {pools} match but the "
            "non-spot ones are full; to fix: add reserved or on-demand capacity or raise "
            "max_spot_fraction"
        )
    else:
        binding = "capacity"
        msg = (
            f"{head}; {pools} match but are full; to fix: add capacity there"
            f"{_relax_hint(plan, stages)}"
        )
    return Unplaced(dep.name, 0, dep.gpus_per_replica, binding, msg)


def explain(plan: Plan, d: int) -> tuple[Unplaced, ...]:
    """Unplaced entries for deployment d (empty when all its replicas are placed)."""
    dep = plan.t.inp.deployments[d]
    missing = dep.target_replicas - plan.placed(d)
    if missing <= 0:
        return ()
    out: list[Unplaced] = []
    deps = plan.t.inp.deployments
    for by, n in sorted(plan.displaced.get(d, {}).items()):
        n = min(n, missing)
        if n <= 0:
            continue
        winner = deps[by]
        out.append(
            Unplaced(
                dep.name,
                n,
                dep.gpus_per_replica,
                "priority",
                f"deployment `{dep.name}` was displaced by higher-priority deployment "
                f"`{winner.name}` (priority {winner.priority} > {dep.priority}) and no other "
                f"admissible pool has room; to fix: add capacity or raise its priority",
                displaced_by=winner.name,
            )
        )
        missing -= n
    if missing > 0:
        stages = plan.t.stage_masks(dep)
        if not stages[-1][1].any():
            base = _static_reason(plan, dep, stages)
        else:
            base = _capacity_reason(plan, dep, stages, plan.blocked.get(d, "capacity"))
        out.append(Unplaced(dep.name, missing, dep.gpus_per_replica, base.constraint, base.reason))
    return tuple(out)
