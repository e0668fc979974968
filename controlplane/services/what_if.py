"""What-if previews: the same engine on a modified copy of the world; writes nothing.

A change is `{"kind": cluster|pool|deployment, "name": …, "set": {engine field: value}}`;
fields the engine's dataclass does not have are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from controlplane import placement as engine
from controlplane.services.placement import World, place, summary


def with_changes(world: World, changes: Iterable[dict[str, Any]]) -> World:
    """A what-if copy of the world: e.g. a cluster down, a pool's reservation ended."""
    inp = world.input
    for change in changes:
        inp = _apply_change(inp, change)
    return replace(world, input=inp)


def _apply_change(inp: engine.PlacementInput, change: dict[str, Any]) -> engine.PlacementInput:
    kind, name, patch = change["kind"], change["name"], change.get("set", {})
    if kind == "cluster":
        return replace(
            inp,
            clusters=tuple(
                replace(c, **_fields(engine.Cluster, patch)) if c.name == name else c
                for c in inp.clusters
            ),
        )
    if kind == "pool":
        return replace(
            inp,
            pools=tuple(
                replace(p, **_fields(engine.Pool, patch)) if p.id == name else p for p in inp.pools
            ),
        )
    return replace(
        inp,
        deployments=tuple(
            replace(d, **_fields(engine.Deployment, patch)) if d.name == name else d
            for d in inp.deployments
        ),
    )


def _fields(cls: type, patch: dict[str, Any]) -> dict[str, Any]:
    known = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    return {k: v for k, v in patch.items() if k in known}


def preview(world: World, changes: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Re-plan with pretend changes against the plan for the unchanged world; writes nothing."""
    baseline = place(world)
    changed = with_changes(world, changes)
    after = place(changed, replace(changed.input, current=baseline.assignments))
    info = summary(changed, after)
    info["moves"] = info.pop("changes")
    info["cost_delta_per_hour"] = f"{after.total_cost_per_hour - baseline.total_cost_per_hour:.6f}"
    return info
