"""Typed views of the rows' JSON columns, parsed here, once, at the database edge.

A deployment's `autoscaling`, `placement` and `failover` columns hold its specs (`controlplane.specs`),
so a knob left unset has exactly one default: the spec's. A row's `status` is ours, one
model per kind (`controlplane.status`); `set_status` checks each key against that model
before it writes. Services read these models, never the raw dicts.
"""

from __future__ import annotations

from typing import Any

from controlplane.db.models import Cluster, Deployment, Pool
from controlplane.specs import AutoscalingSpec, FailoverSpec, PlacementSpec
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
