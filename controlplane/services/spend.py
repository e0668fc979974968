"""The spend guard against the database: what reported demand may add before placement
runs, what it added after (kept in each deployment's status), `SpendGuardTriggered` events.

The bounds and their arithmetic are `controlplane.spend`'s; this module only loads and
writes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane import placement as engine
from controlplane.db import models as m
from controlplane.db.columns import deployment_autoscaling, deployment_status, set_status
from controlplane.settings import Settings
from controlplane.spend import Ask, Bite, Grant, SpendLimits, allow, granted, recent

EVENT_EVERY = timedelta(minutes=10)
"""The same bound biting the same deployment is told once per this."""


def asks(world_input: engine.PlacementInput, rows: dict[str, m.Deployment]) -> list[Ask]:
    placed: dict[str, int] = {}
    for a in world_input.current:
        placed[a.deployment] = placed.get(a.deployment, 0) + a.replicas
    result = []
    for dep in world_input.deployments:
        auto = deployment_autoscaling(rows[dep.name])
        floor = max(auto.min_replicas, 1 if auto.max_replicas >= 1 else 0)
        prices = [
            p.price_per_gpu_hour
            for p in world_input.pools
            if not dep.gpu_types or p.gpu_type in dep.gpu_types
        ]
        result.append(
            Ask(
                deployment=dep.name,
                baseline=max(floor, placed.get(dep.name, 0)),
                wanted=dep.wanted_replicas,
                gpus_per_replica=dep.gpus_per_replica,
                price_per_gpu_hour=max(prices, default=0.0),
            )
        )
    return result


def guard(
    session: Session,
    world_input: engine.PlacementInput,
    rows: dict[str, m.Deployment],
    now: datetime,
    limits: SpendLimits,
) -> tuple[engine.PlacementInput, list[Ask]]:
    """The placement input with reported demand bounded, and the asks (for `record`)."""
    wishes = asks(world_input, rows)
    grants = {name: _grants(row) for name, row in rows.items()}
    allowance = allow(wishes, grants, now, limits)
    for bite in allowance.bites:
        _tell(session, rows[bite.deployment], bite, now)
    deployments = tuple(
        replace(d, wanted_replicas=allowance.wanted.get(d.name, d.wanted_replicas))
        for d in world_input.deployments
    )
    bounded = {b.deployment: b.allowed for b in allowance.bites}
    wishes = [replace(a, wanted=bounded.get(a.deployment, a.wanted)) for a in wishes]
    return replace(world_input, deployments=deployments), wishes


def record(
    rows: dict[str, m.Deployment],
    wishes: list[Ask],
    result: engine.PlacementResult,
    now: datetime,
    limits: SpendLimits,
) -> None:
    """Keep, per deployment, what placement added from reported demand within the window."""
    placed: dict[str, int] = {}
    for a in result.assignments:
        placed[a.deployment] = placed.get(a.deployment, 0) + a.replicas
    for ask in wishes:
        row = rows[ask.deployment]
        kept = recent(_grants(row), now, limits.window)
        new = granted(ask, placed.get(ask.deployment, 0), now)
        if new is not None:
            kept.append(new)
        grants = [{"at": g.at, "gpus": g.gpus, "cost_per_hour": g.cost_per_hour} for g in kept]
        set_status(row, demand_grants=grants or None)


def _grants(row: m.Deployment) -> list[Grant]:
    return [Grant(g.at, g.gpus, g.cost_per_hour) for g in deployment_status(row).demand_grants]


def _tell(session: Session, row: m.Deployment, bite: Bite, now: datetime) -> None:
    last = session.scalars(
        select(m.Event)
        .where(
            m.Event.type == "SpendGuardTriggered",
            m.Event.object_name == row.name,
            m.Event.time > now - EVENT_EVERY,
        )
        .order_by(m.Event.time.desc())
        .limit(1)
    ).first()
    if last is not None and last.data.get("bound") == bite.bound:
        return
    session.add(
        m.Event(
            time=now,
            type="SpendGuardTriggered",
            object_kind="Deployment",
            object_id=row.id,
            object_name=row.name,
            message=bite.message,
            data={
                "deployment": bite.deployment,
                "bound": bite.bound,
                "setting": bite.setting,
                "asked": bite.asked,
                "allowed": bite.allowed,
            },
        )
    )


def limits_from(settings: Settings) -> SpendLimits:
    """The spend guard's bounds from `GPUFLEET_SPEND_GUARD_*`: every re-plan (the worker's,
    the API's) uses these — one with the defaults would also prune the guard's record of
    what it granted to the default window."""
    return SpendLimits(
        window=timedelta(seconds=settings.spend_guard_window_s),
        gpus_per_deployment=settings.spend_guard_gpus_per_deployment,
        cost_per_deployment=settings.spend_guard_cost_per_deployment,
        fleet_cost=settings.spend_guard_fleet_cost,
    )
