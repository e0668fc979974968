"""What the control plane keeps in a row's `status`: one model per kind, no I/O.

The database edge (`controlplane.db.columns`) parses a row's status into these; the API
describes its responses with them. Keys this version does not know are ignored, so an older
and a newer control plane can share a database during an upgrade.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


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


class PoolCapacity(Status):
    """What a plane last reported of one pool: placement counts no more than `total_gpus`
    there while the report is recent, and only what is in use while replicas wait."""

    total_gpus: int | None = None
    free_gpus: int = 0
    waiting_replicas: dict[str, int] = Field(
        default_factory=dict, description="per deployment: replicas that cannot start there"
    )
    reported_at: datetime
    plan: tuple[int, int] | None = Field(
        default=None,
        description="(epoch, generation) of the desired state the waiting replicas are of",
    )


class ClusterStatus(Status):
    cordoned: bool = False
    demand: dict[str, int] = Field(
        default_factory=dict, description="replicas this plane's autoscalers want, per deployment"
    )
    capacity: dict[str, PoolCapacity] = Field(
        default_factory=dict, description="per pool: what the plane's runtime reports it has"
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


class ReservedView(Status):
    cluster: str
    pool: str
    gpus: int
    reason: str = Field(description="what they are for: a running rollout's lane or the shadow")


class PlacementStatus(Status):
    """A deployment's share of the last placement: where, what it costs, why not more."""

    wanted_replicas: int = 0
    placed_replicas: int = 0
    cost_per_hour: str = "0.000000"
    assignments: list[AssignmentView] = Field(default_factory=list)
    unplaced: list[UnplacedView] = Field(default_factory=list)
    standby_replicas: int = Field(
        default=0, description="failover active_passive: replicas kept warm on the standby"
    )
    standby: list[AssignmentView] = Field(
        default_factory=list, description="where the standby replicas are (not in assignments)"
    )
    reserved_gpus: int = Field(
        default=0,
        description="GPUs held beyond the placed replicas for a running rollout (a canary's "
        "pre-scaled replica, a blue-green's second copy) and the shadow; in cost_per_hour",
    )
    reserved: list[ReservedView] = Field(
        default_factory=list, description="where the reserved GPUs are and what for"
    )


class ProcurementNote(Status):
    pool: str
    reason: str
    message: str


class DemandGrant(Status):
    """Replicas placement added from reported demand (the spend guard's window)."""

    at: datetime
    gpus: int
    cost_per_hour: float


class DeploymentStatus(Status):
    placement: PlacementStatus | None = None
    procurement: ProcurementNote | None = None
    demand_grants: list[DemandGrant] = Field(default_factory=list)
