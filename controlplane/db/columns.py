"""Typed views of the rows' JSON columns, parsed here, once, at the database edge.

A deployment's `autoscaling` and `placement` columns hold its specs (`controlplane.specs`),
so a knob left unset has exactly one default: the spec's. Every managed row's `status` is
ours, one model per kind; `set_status` checks each key against that model before it writes.
Services read these models, never the raw dicts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.db.models import Cluster, Deployment, Pool
from controlplane.specs import AutoscalingSpec, PlacementSpec


def deployment_autoscaling(row: Deployment) -> AutoscalingSpec:
    return autoscaling_from(row.autoscaling)


def autoscaling_from(column: dict[str, Any] | None) -> AutoscalingSpec:
    """The `autoscaling` column's value as a spec (old spellings still parse)."""
    return AutoscalingSpec.model_validate(column or {})


def deployment_placement(row: Deployment) -> PlacementSpec:
    return PlacementSpec.model_validate(row.placement or {})


class Status(BaseModel):
    """Keys written by an older or newer control plane are ignored, never fatal."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# --- pools ---------------------------------------------------------------------------------


class Outage(Status):
    since: datetime
    message: str


class PoolError(Status):
    error: str
    message: str
    at: datetime


class QuotaExceededNote(Status):
    message: str
    at: datetime
    until: datetime


class Offer(Status):
    """The provider's best offer for the pool's shape, as last refreshed."""

    instance_type: str | None = None
    zone: str | None = None
    on_demand_price: float | None = None
    spot_price: float | None = None
    available: bool = False
    refreshed_at: datetime | None = None


class PoolStatus(Status):
    """What procurement last saw of a pool; `*_until`: no new instances before then."""

    held_gpus: int = Field(default=0, description="GPUs of the instances we hold there")
    idle_reserved_gpus: int | None = None
    blocked: str | None = Field(
        default=None, description="why it gets no instances although it needs some"
    )
    outage: Outage | None = None
    exhausted_until: datetime | None = None
    quota_until: datetime | None = None
    quota_exceeded: QuotaExceededNote | None = None
    failing_until: datetime | None = None
    last_error: PoolError | None = None
    offer: Offer | None = None
    spot_price_per_gpu_hour: float | None = None
    spot_available_gpus: int | None = Field(
        default=None, description="what placement may plan to buy in a spot pool"
    )


# --- clusters ------------------------------------------------------------------------------


class ClusterStatus(Status):
    cordoned: bool = False
    demand: dict[str, int] = Field(
        default_factory=dict, description="replicas this plane's autoscalers want, per deployment"
    )


# --- deployments ---------------------------------------------------------------------------


class AssignmentView(Status):
    cluster: str
    pool: str
    replicas: int


class UnplacedView(Status):
    replicas: int
    constraint: str = Field(description="the binding constraint, e.g. capacity, gpu_types")
    reason: str = Field(description="what stops them and what to change")
    displaced_by: str | None = None


class PlacementStatus(Status):
    """A deployment's share of the last placement: where, what it costs, why not more."""

    wanted_replicas: int = 0
    placed_replicas: int = 0
    cost_per_hour: str = "0.000000"
    assignments: list[AssignmentView] = Field(default_factory=list)
    unplaced: list[UnplacedView] = Field(default_factory=list)


class ProcurementNote(Status):
    pool: str
    reason: str
    message: str


class DeploymentStatus(Status):
    placement: PlacementStatus | None = None
    procurement: ProcurementNote | None = None


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
