"""What the plane reports upward about its GPUs: per pool, the GPUs it can use, the free ones
and the replicas that cannot start for lack of them (``FreeCapacity`` in the heartbeat).

Pure: the desired state, the replicas, the starts reconcile wants and the runtime's GPU
counts in, reports out. The runtime's GPUs are one set shared by every pool the plane runs:
a pool's ``total_gpus`` is what its replicas use plus what is free, so no pool is reported
as larger than the plane can give it. A start that does not fit in the free GPUs (in
reconcile's order) is a waiting replica: the control plane re-places it elsewhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from controlplane.contracts import DesiredState, FreeCapacity, ReplicaStatus
from workloadplane.reconcile import StartReplica


def free_capacity(
    desired: DesiredState | None,
    replicas: Sequence[ReplicaStatus],
    starts: Sequence[StartReplica],
    total_gpus: int,
    free_gpus: int,
) -> list[FreeCapacity]:
    """One report per pool the desired state or a replica names (one for ``pool=None`` when
    none does, e.g. before the first snapshot); ``total_gpus``/``free_gpus``: the runtime's
    whole GPU set."""
    deployments = desired.deployments if desired is not None else []
    specs = {d.name: d.spec for d in deployments}
    pools: dict[str | None, str] = {}  # pool -> a GPU type seen there
    for d in deployments:
        gpu_type = d.spec.gpu_types[0] if d.spec.gpu_types else ""
        for pool in [q.pool for q in d.pool_quotas] + d.pools:
            pools.setdefault(pool, gpu_type)
    for inst in desired.instances if desired is not None else []:
        pools.setdefault(inst.pool, "")
    used: dict[str | None, int] = defaultdict(int)
    for r in replicas:
        if r.state != "failed" and r.deployment in specs:
            used[r.pool] += specs[r.deployment].gpus_per_replica
            pools.setdefault(r.pool, "")
    if not pools:
        pools[None] = ""
    waiting: dict[str | None, dict[str, int]] = defaultdict(dict)
    left = free_gpus
    for start in starts:
        pools.setdefault(start.pool, "")
        need = start.spec.gpus_per_replica
        if need <= left:
            left -= need
        else:
            per_pool = waiting[start.pool]
            per_pool[start.deployment] = per_pool.get(start.deployment, 0) + 1
    return [
        FreeCapacity(
            gpu_type=gpu_type,
            pool=pool,
            gpus=free_gpus,
            total_gpus=min(total_gpus, used[pool] + free_gpus),
            waiting_replicas=waiting.get(pool, {}),
        )
        for pool, gpu_type in sorted(pools.items(), key=lambda kv: kv[0] or "")
    ]
