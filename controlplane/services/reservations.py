"""GPUs that placement holds for rollouts and shadows (docs/rollouts.md, "Placement during a
rollout or a shadow").

While a rollout runs, a deployment placed on a cluster is two entries there (the stable
revision and the lane, `controlplane.rollouts.lane_entries`), and a deployment with a shadow
runs its shadow lane beside it (`controlplane.shadows.shadow_entry`). What they run beyond
the replicas placement gave the deployment — a canary's pre-scaled or rounded-up replica, a
blue-green's whole second copy, the shadow's replicas, a change of GPUs per replica — is
**reserved**: taken out of the pool's free GPUs before the engine runs (then out of what can
still be procured), so that no other deployment is placed on those GPUs, procurement buys
them where the pool has none free, and they are priced on the deployment. A reservation
never takes a GPU a placed replica uses: a rollout displaces no one, and what it cannot
hold its lane waits for (the rollout's reason says where). Like the standby
(`services.standby`), this is an input transformation: the engine knows nothing of it.

A reservation is charged to the pool that holds most of the deployment's replicas on that
cluster (the lane fills the same pools in order of preference). What cannot be reserved
anywhere — a full pool with nothing to procure — leaves the lane waiting for GPUs, and the
rollout says so (`rollouts.decide`'s waiting note); it is held as soon as GPUs free up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from controlplane import placement as engine
from controlplane import rollouts
from controlplane.services.lanes import Canary
from controlplane.specs import ShadowSpec


@dataclass(frozen=True)
class Reserved:
    deployment: str
    cluster: str
    pool: str
    gpus: int
    reason: str
    """What the GPUs are for, e.g. ``rollout to revision 3 (blue_green)`` or ``shadow``."""


def reservations(
    placed: Iterable[engine.Assignment],
    gpus_per_replica: Mapping[str, int],
    canaries: Mapping[str, Canary],
    shadows: Mapping[str, ShadowSpec],
) -> list[Reserved]:
    """Per deployment and cluster of the stored placement (``placed``), the GPUs its running
    rollout and its shadow need there beyond its placed replicas (see the module)."""
    here: dict[tuple[str, str], int] = defaultdict(int)
    by_pool: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for a in placed:
        if a.replicas > 0:
            here[(a.deployment, a.cluster)] += a.replicas
            by_pool[(a.deployment, a.cluster)][a.pool] += a.replicas
    out: list[Reserved] = []
    for (name, cluster), n in sorted(here.items()):
        pools = by_pool[(name, cluster)]
        pool = min(pools, key=lambda p: (-pools[p], p))
        gpus = gpus_per_replica.get(name, 1)
        c = canaries.get(name)
        if c is not None:
            extra = rollouts.extra_gpus(n, c.stable.gpus_per_replica, gpus, c.state, c.policy)
            if extra > 0:
                strategy = "blue_green" if c.policy.blue_green else "canary"
                out.append(Reserved(name, cluster, pool, extra, f"rollout {c.lane} ({strategy})"))
        shadow = shadows.get(name)
        if shadow is not None:
            out.append(Reserved(name, cluster, pool, shadow.replicas * gpus, "shadow"))
    return out


def per_pool(reserved: Iterable[Reserved]) -> dict[str, dict[str, int]]:
    """Pool → cluster → reserved GPUs."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in reserved:
        out[r.pool][r.cluster] += r.gpus
    return out


def reserve(
    inp: engine.PlacementInput, wanted: Iterable[Reserved]
) -> tuple[engine.PlacementInput, list[Reserved]]:
    """The engine's input with the reserved GPUs out of each pool, and what is held. A
    reservation takes a pool's free GPUs (its capacity less what the current placement
    uses), then what can still be procured there (the engine then buys capacity back for
    what it places there, and `instance_gpus_wanted` adds the held GPUs), in order; it never
    takes a GPU a placed replica uses, so a rollout or a shadow displaces no one (what it
    cannot hold, its lane waits for). Held reservations of 0 GPUs are left out."""
    wanted = list(wanted)
    if not wanted:
        return inp, []
    per_replica = {d.name: d.gpus_per_replica for d in inp.deployments}
    used: dict[str, int] = defaultdict(int)
    for a in inp.current:
        used[a.pool] += a.replicas * per_replica.get(a.deployment, 1)
    pools = {p.id: p for p in inp.pools}
    free = {p.id: max(0, p.capacity_gpus - used[p.id]) for p in inp.pools}
    procurable = {p.id: p.procurable_gpus for p in inp.pools}
    from_capacity: dict[str, int] = defaultdict(int)
    held: list[Reserved] = []
    for r in wanted:
        if r.pool not in pools:
            continue
        own = min(r.gpus, free[r.pool])
        bought = min(r.gpus - own, procurable[r.pool])
        free[r.pool] -= own
        procurable[r.pool] -= bought
        from_capacity[r.pool] += own
        if own + bought > 0:
            held.append(replace(r, gpus=own + bought))
    return replace(
        inp,
        pools=tuple(
            replace(
                p,
                capacity_gpus=p.capacity_gpus - from_capacity.get(p.id, 0),
                procurable_gpus=procurable[p.id],
            )
            for p in inp.pools
        ),
    ), held
