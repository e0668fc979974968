"""Typed views of the rows' JSON columns, parsed here, once, at the database edge.

A deployment's `autoscaling`, `placement`, `failover` and `rollout` columns hold its specs (`controlplane.specs`),
so a knob left unset has exactly one default: the spec's. A row's `status` is ours, one
model per kind (`controlplane.status`); `set_status` checks each key against that model
before it writes. Services read these models, never the raw dicts.
"""

from __future__ import annotations

from typing import Any

from controlplane import rollouts as canary
from controlplane.db.models import Cluster, Deployment, Pool, Rollout
from controlplane.specs import (
    AutoscalingSpec,
    FailoverSpec,
    PlacementSpec,
    RolloutSpec,
    RolloutStrategy,
)
from controlplane.status import ClusterStatus, DeploymentStatus, PoolStatus, Status


def deployment_autoscaling(row: Deployment) -> AutoscalingSpec:
    return autoscaling_from(row.autoscaling)


def autoscaling_from(column: dict[str, Any] | None) -> AutoscalingSpec:
    """The `autoscaling` column's value as a spec (old spellings still parse)."""
    return AutoscalingSpec.model_validate(column or {})


def deployment_placement(row: Deployment) -> PlacementSpec:
    return PlacementSpec.model_validate(row.placement or {})


def deployment_failover(row: Deployment) -> FailoverSpec:
    return FailoverSpec.model_validate(row.failover or {})


def deployment_rollout(row: Deployment) -> RolloutSpec:
    return RolloutSpec.model_validate(row.rollout or {})


def policy_of(spec: RolloutSpec) -> canary.CanaryPolicy:
    g = spec.gates
    gates = canary.Gates(
        min_requests=g.min_requests,
        max_error_rate_increase=g.max_error_rate_increase,
        max_p99_ttft_ratio=g.max_p99_ttft_ratio,
        max_p99_e2e_ratio=g.max_p99_e2e_ratio,
    )
    if spec.strategy is RolloutStrategy.blue_green:
        return canary.blue_green(spec.keep_seconds, gates)
    return canary.CanaryPolicy(steps=tuple(spec.steps), hold_s=spec.hold_seconds, gates=gates)


def rollout_policy(row: Rollout) -> canary.CanaryPolicy:
    """The steps, hold and gates a rollout started with."""
    return policy_of(RolloutSpec.model_validate(row.policy or {}))


def rollout_state(row: Rollout) -> canary.Rollout:
    """The pure state of a rollout row; ValueError for a superseded one (no pure phase)."""
    return canary.Rollout(
        step=row.step,
        phase=canary.Phase(row.phase),
        since=row.since,
        reason=row.reason,
        paused_from=canary.Phase(row.paused_from) if row.paused_from else None,
    )


STATUS_MODELS: dict[type, type[Status]] = {
    Pool: PoolStatus,
    Cluster: ClusterStatus,
    Deployment: DeploymentStatus,
}


def pool_status(row: Pool) -> PoolStatus:
    return PoolStatus.model_validate(row.status or {})


def cluster_status(row: Cluster) -> ClusterStatus:
    return ClusterStatus.model_validate(row.status or {})


def deployment_status(row: Deployment) -> DeploymentStatus:
    return DeploymentStatus.model_validate(row.status or {})


def set_status(row: Pool | Cluster | Deployment, **values: Any) -> bool:
    """Set keys of `row.status` (None removes one), each checked against the row's status
    model; keys this call does not name are kept. Writes only on change; True if it did."""
    model = STATUS_MODELS[type(row)]
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise KeyError(f"{model.__name__} has no {', '.join(unknown)}")
    given = {k: v for k, v in values.items() if v is not None}
    checked = model.model_validate(given).model_dump(mode="json", include=set(given))
    status = {k: v for k, v in (row.status or {}).items() if k not in values} | checked
    if status == (row.status or {}):
        return False
    row.status = status
    return True
