"""The spend guard: how much reported demand may add, per deployment and fleet-wide, within
a sliding window. Pure, no I/O; the clock is passed in.

Demand reported by planes raises a deployment's wanted replicas above its *baseline* (what
it has placed now, or its floor without demand); placement then buys what that takes. The
guard bounds that growth: per deployment at most `gpus_per_deployment` GPUs and
`cost_per_deployment` $/h added per window, and fleet-wide at most `fleet_cost` $/h added
per window. What the spec asks for (min replicas) is never bounded here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

SETTINGS = {
    "gpus_per_deployment": "GPUFLEET_SPEND_GUARD_GPUS_PER_DEPLOYMENT",
    "cost_per_deployment": "GPUFLEET_SPEND_GUARD_COST_PER_DEPLOYMENT",
    "fleet_cost": "GPUFLEET_SPEND_GUARD_FLEET_COST",
}
"""The setting that raises each bound (named in every `SpendGuardTriggered` event)."""


@dataclass(frozen=True)
class SpendLimits:
    window: timedelta = timedelta(hours=1)
    gpus_per_deployment: int = 64
    cost_per_deployment: float = 250.0
    fleet_cost: float = 1000.0


@dataclass(frozen=True)
class Grant:
    """Growth from reported demand that placement carried out: when, GPUs, $/h."""

    at: datetime
    gpus: int
    cost_per_hour: float


@dataclass(frozen=True)
class Ask:
    """One deployment's wish: `wanted` replicas with reported demand against `baseline`
    without it; `price_per_gpu_hour` is an upper estimate of what a new GPU costs."""

    deployment: str
    baseline: int
    wanted: int
    gpus_per_replica: int
    price_per_gpu_hour: float

    @property
    def cost_per_replica(self) -> float:
        return self.gpus_per_replica * self.price_per_gpu_hour


@dataclass(frozen=True)
class Bite:
    """The guard held `deployment` to `allowed` replicas instead of `asked`."""

    deployment: str
    bound: str
    setting: str
    asked: int
    allowed: int
    message: str


@dataclass(frozen=True)
class Allowance:
    wanted: dict[str, int]
    bites: list[Bite] = field(default_factory=list)


def recent(grants: Iterable[Grant], now: datetime, window: timedelta) -> list[Grant]:
    return [g for g in grants if now - g.at < window]


def _room(left: float, each: float) -> float:
    """How many items of size `each` fit in `left` (no limit for free items)."""
    return math.inf if each <= 0 else max(0.0, math.floor(left / each + 1e-9))


def allow(
    asks: Sequence[Ask],
    grants: Mapping[str, Sequence[Grant]],
    now: datetime,
    limits: SpendLimits,
) -> Allowance:
    """Wanted replicas per deployment after the guard, and where it bit.

    Deployments are served in name order against the fleet-wide bound, each reserving what
    it is allowed, so one call never lets the fleet exceed it.
    """
    window = {name: recent(gs, now, limits.window) for name, gs in grants.items()}
    fleet_used = sum(g.cost_per_hour for gs in window.values() for g in gs)
    wanted: dict[str, int] = {}
    bites: list[Bite] = []
    for ask in sorted(asks, key=lambda a: a.deployment):
        growth = ask.wanted - ask.baseline
        if growth <= 0:
            wanted[ask.deployment] = ask.wanted
            continue
        mine = window.get(ask.deployment, [])
        used_gpus = sum(g.gpus for g in mine)
        used_cost = sum(g.cost_per_hour for g in mine)
        room = {
            "gpus_per_deployment": _room(limits.gpus_per_deployment - used_gpus, ask.gpus_per_replica),
            "cost_per_deployment": _room(limits.cost_per_deployment - used_cost, ask.cost_per_replica),
            "fleet_cost": _room(limits.fleet_cost - fleet_used, ask.cost_per_replica),
        }  # fmt: skip
        bound = min(room, key=lambda k: room[k])
        allowed = int(min(growth, room[bound]))
        if allowed < growth:
            bites.append(_bite(ask, bound, allowed, limits, used_gpus, used_cost, fleet_used))
        fleet_used += allowed * ask.cost_per_replica
        wanted[ask.deployment] = ask.baseline + allowed
    return Allowance(wanted, bites)


def _bite(
    ask: Ask,
    bound: str,
    allowed: int,
    limits: SpendLimits,
    used_gpus: int,
    used_cost: float,
    fleet_used: float,
) -> Bite:
    hours = limits.window.total_seconds() / 3600
    per = f"per {hours:g} h" if hours != 1 else "per hour"
    already = {
        "gpus_per_deployment": f"{used_gpus} GPUs of {limits.gpus_per_deployment} {per} "
        "already added for it",
        "cost_per_deployment": f"${used_cost:.2f}/h of ${limits.cost_per_deployment:.2f}/h "
        f"{per} already added for it",
        "fleet_cost": f"${fleet_used:.2f}/h of ${limits.fleet_cost:.2f}/h {per} already "
        "added fleet-wide",
    }[bound]
    asked = ask.wanted
    held = ask.baseline + allowed
    return Bite(
        deployment=ask.deployment,
        bound=bound,
        setting=SETTINGS[bound],
        asked=asked,
        allowed=held,
        message=f"reported demand asks {asked} replicas of {ask.deployment}, the spend guard "
        f"allows {held} ({bound}: {already}); raise {SETTINGS[bound]} to allow more",
    )


def granted(ask: Ask, placed: int, now: datetime) -> Grant | None:
    """What placement added from reported demand (None: nothing): the placed replicas above
    the baseline, at the upper estimate `allow` checked them against. At the deployment's
    average cost instead, 8 replicas on a $1 pool and 8 new on a $10 one were kept as
    $44/h where $80/h was added: the bounds could be passed by the ratio of the prices."""
    growth = min(placed, ask.wanted) - ask.baseline
    if growth <= 0:
        return None
    return Grant(now, growth * ask.gpus_per_replica, round(growth * ask.cost_per_replica, 6))
