"""The planes' capacity reports as placement input: a pool counts no more GPUs than its
reporting planes have, and replicas that cannot start are not counted as placed.

Pure over rows already loaded: clusters' stored reports (`ClusterStatus.capacity`, written by
`services.observed`) in, GPU counts and replica counts out; see docs/placement.md.
"""

from __future__ import annotations

from collections import defaultdict

from controlplane import placement as engine
from controlplane.db import models as m
from controlplane.db.columns import cluster_status
from controlplane.status import PoolCapacity

REPORTING = ("healthy", "stale", "cordoned")  # a plane in these states reported recently


def reported_capacity(
    clusters: dict[str, m.Cluster],
) -> dict[str, dict[str, PoolCapacity]]:
    """Pool → cluster → what that plane last reported of the pool, for the planes that
    report (heartbeats arrive); a down plane's old report does not count. Replicas reported
    waiting against an older desired state than the cluster's current one are not counted:
    the plane has not yet acted on the newer plan, which may already have moved them (counted
    again, they would shrink the new plan's share there too — placement would flap)."""
    out: dict[str, dict[str, PoolCapacity]] = defaultdict(dict)
    for name, row in clusters.items():
        if row.state in REPORTING:
            current = (row.desired_epoch, row.desired_generation)
            for pool, cap in cluster_status(row).capacity.items():
                stale = cap.plan is not None and cap.plan < current
                out[pool][name] = cap.model_copy(update={"waiting_replicas": {}}) if stale else cap
    return out


def usable_gpus(
    inventory: int, reports: dict[str, PoolCapacity], running: dict[str, int] | None = None
) -> int:
    """The smaller of the inventory's figure and what the pool's planes (cluster → report)
    say they have: each its `total_gpus`, or, while some of its replicas cannot start, only
    the GPUs of the placed replicas that run there (`running`, cluster → GPUs), so the next
    plan puts nothing more there. No report: the inventory."""
    running = running or {}
    counted = [
        min(cap.total_gpus if cap.total_gpus is not None else inventory, running.get(name, 0))
        if cap.waiting_replicas
        else cap.total_gpus
        for name, cap in reports.items()
        if cap.total_gpus is not None or cap.waiting_replicas
    ]
    return min(inventory, sum(c for c in counted if c is not None)) if counted else inventory


def running_share(
    assignment: engine.Assignment, reports: dict[str, dict[str, PoolCapacity]]
) -> int:
    """The replicas of a current assignment that can run: those its plane reports as
    waiting for GPUs are not counted as placed (the engine places them anew, elsewhere)."""
    cap = reports.get(assignment.pool, {}).get(assignment.cluster)
    waiting = cap.waiting_replicas.get(assignment.deployment, 0) if cap is not None else 0
    return max(0, assignment.replicas - waiting)
