"""HTTP-only shapes: what each route returns, so that `/api/v1/openapi.json` describes it.

Request bodies are the specs (`controlplane.specs`). Services build the response JSON; these
models only describe it (routes return it as built, so no byte changes), and
tests/integration/api/test_openapi.py checks real responses against them.
"""

# No `from __future__ import annotations`: `create_model` and FastAPI read the types at runtime.

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, create_model

from controlplane.contracts import NatsCredentials
from controlplane.services.resources import KINDS, ResourceKind
from controlplane.status import ClusterStatus, DeploymentStatus, PlacementStatus, PoolStatus

T = TypeVar("T")


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Page(Out, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="pass it as `cursor` for the next page")


class HealthOut(Out):
    status: str
    reason: str | None = None
    """Why it is not ready: the database driver's error kind (e.g. OperationalError); the
    message, which names the database's host, port and user, is only in the log."""


class FieldErrorOut(Out):
    field: str = Field(description="the field or parameter, e.g. `autoscaling.max_replicas`")
    message: str = Field(description="what is wrong and what to change")


class ProblemOut(Out):
    """Every error, as RFC 9457 problem JSON (`application/problem+json`)."""

    model_config = ConfigDict(title="Problem")
    type: str = Field(description="a URI naming the kind of problem")
    title: str
    status: int
    detail: str = Field(description="what went wrong and how to fix it")
    instance: str | None = Field(default=None, description="the request's path")
    errors: list[FieldErrorOut] | None = Field(
        default=None, description="one entry per invalid field"
    )


# --- managed objects -----------------------------------------------------------------------


class NoStatus(Out):
    pass


class ClusterStatusOut(ClusterStatus):
    state: str = Field(description="pending, healthy, stale, down or cordoned")
    agent_version: str | None = None
    last_heartbeat_at: datetime | None = None
    desired_generation: int
    observed_generation: int


class DeploymentStatusOut(DeploymentStatus):
    revision: int
    demand_replicas: int = Field(description="replicas the planes' autoscalers want, summed")


class TokenStatusOut(Out):
    prefix: str = Field(description="the token's first characters, to recognise it")
    last_used_at: datetime | None = None


STATUS_OUT: dict[str, type[BaseModel]] = {
    "pools": PoolStatus,
    "clusters": ClusterStatusOut,
    "deployments": DeploymentStatusOut,
    "tokens": TokenStatusOut,
}
SECRETS_OUT: dict[str, dict[str, Any]] = {
    "tokens": {
        "token": (
            str | None,
            Field(default=None, description="the secret, only in the response that created it"),
        )
    },
    "clusters": {
        "nats_credentials": (
            NatsCredentials | None,
            Field(default=None, description="the agent's login, only when the cluster is created"),
        )
    },
}


def object_model(kind: ResourceKind) -> type[BaseModel]:
    """A managed object as the API returns it: its spec plus what the server keeps."""
    fields: dict[str, Any] = {
        "kind": (Literal[kind.kind], ...),  # type: ignore[valid-type]
        "id": (str, ...),
        "generation": (int, Field(description="bumped only when the spec really changes")),
        "created_at": (datetime, ...),
        "updated_at": (datetime, ...),
        "status": (STATUS_OUT.get(kind.path, NoStatus), ...),
        **SECRETS_OUT.get(kind.path, {}),
    }
    return create_model(kind.kind, __base__=kind.spec, **fields)


OBJECTS: dict[str, type[BaseModel]] = {path: object_model(kind) for path, kind in KINDS.items()}
PAGES: dict[str, type[BaseModel]] = {
    path: Page[model]  # type: ignore[valid-type]
    for path, model in OBJECTS.items()
}


# --- read-only records ---------------------------------------------------------------------


class PlacementRecord(Out):
    id: str
    deployment_id: str
    cluster_id: str
    pool_id: str
    replicas: int
    min_replicas: int
    max_replicas: int
    cost_per_hour: str = Field(description="exact decimal, 6 places")
    plan_generation: int
    created_at: datetime
    updated_at: datetime


class ReplicaRecord(Out):
    id: str
    name: str
    deployment_id: str
    cluster_id: str
    instance_id: str | None
    revision: int
    state: str
    endpoint: str | None
    created_at: datetime
    updated_at: datetime


class InstanceRecord(Out):
    id: str
    pool_id: str
    cluster_id: str | None
    provider_instance_id: str | None
    idempotency_key: str
    gpus: int
    state: str
    health: str
    drain_deadline: datetime | None
    idle_since: datetime | None
    error: str | None
    created_at: datetime
    updated_at: datetime


class EventRecord(Out):
    id: str
    time: datetime
    occurred_at: datetime | None = Field(
        default=None,
        description="when a plane's fact happened there (its own time; `time` is when the "
        "control plane received it)",
    )
    type: str
    object_kind: str
    object_id: str | None
    object_name: str | None
    message: str
    data: dict[str, Any]


class AuditRecord(Out):
    id: str
    time: datetime
    actor: str
    action: str
    resource_kind: str
    resource_id: str | None
    resource_name: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    request_id: str | None


class RevisionRecord(Out):
    id: str
    deployment_id: str
    revision: int
    spec: dict[str, Any]
    created_at: datetime


RECORDS_OUT: dict[str, type[BaseModel]] = {
    "placements": PlacementRecord,
    "replicas": ReplicaRecord,
    "instances": InstanceRecord,
    "events": EventRecord,
    "audit": AuditRecord,
}
RECORD_PAGES: dict[str, type[BaseModel]] = {
    path: Page[model]  # type: ignore[valid-type]
    for path, model in RECORDS_OUT.items()
}
RevisionPage = Page[RevisionRecord]


# --- rollouts (docs/rollouts.md) ------------------------------------------------------------


class WindowOut(Out):
    requests: int
    errors: int
    error_rate: float
    p99_ttft_s: float
    p99_e2e_s: float


class RolloutWindows(Out):
    stable: WindowOut | None = None
    new: WindowOut | None = None
    before_switch: WindowOut | None = Field(
        default=None,
        description="blue_green: the stable revision from the start to the switch, the "
        "baseline its keep window is judged against",
    )


class RolloutOut(Out):
    id: str
    deployment: str
    strategy: str
    from_revision: int = Field(description="the stable revision")
    to_revision: int = Field(description="the new revision the rollout moves traffic to")
    lane: str = Field(description="the desired-state entry that runs the new revision")
    phase: str = Field(
        description="scaling, holding (canary), keeping (blue_green: switched, the stable "
        "revision kept for an instant rollback), paused, promoted, rolled_back or superseded "
        "(a later change of the revision ended it)"
    )
    step: int = Field(description="index into `steps` of the share it has or scales to")
    steps: list[float]
    share: float = Field(description="the new revision's share of the traffic now")
    reason: str
    since: datetime = Field(description="when the current phase began")
    paused_from: str | None
    windows: RolloutWindows = Field(description="what the gates compared at the last look")
    keep_seconds: float | None = Field(
        default=None,
        description="blue_green: how long the stable revision is kept after the switch",
    )
    keep_until: datetime | None = Field(
        default=None,
        description="blue_green, keeping: when the keep window ends and the rollout is promoted",
    )
    created_at: datetime
    updated_at: datetime | None
    finished_at: datetime | None


# --- placement -----------------------------------------------------------------------------


class AssignmentOut(Out):
    deployment: str
    cluster: str
    pool: str
    replicas: int


class ChangeOut(Out):
    kind: Literal["add", "remove", "move"]
    deployment: str
    replicas: int
    from_cluster: str | None = None
    from_pool: str | None = None
    to_cluster: str | None = None
    to_pool: str | None = None


class ProcurementOut(Out):
    pool: str
    gpus: int
    instances: int


class CurrentPlacement(Out):
    total_cost_per_hour: str
    deployments: dict[str, PlacementStatus] = Field(
        description="per deployment: wanted and placed replicas, cost, assignments, why not more"
    )
    assignments: list[AssignmentOut]


class Replanned(Out):
    total_cost_per_hour: str
    deployments: dict[str, PlacementStatus]
    changes: list[ChangeOut]
    procurement: list[ProcurementOut] = Field(description="instances to buy for this plan")


class PreviewOut(Out):
    total_cost_per_hour: str
    deployments: dict[str, PlacementStatus]
    moves: list[ChangeOut]
    procurement: list[ProcurementOut]
    cost_delta_per_hour: str = Field(description="after minus before, per hour")


# --- costs (GET /costs, docs/cost.md) ------------------------------------------------------


class CostGroupOut(Out):
    name: str = Field(description="the group's value; `(idle)`: held GPUs no placement uses")
    cost: float = Field(description="dollars")
    share: float = Field(description="of the window's total cost, 0–1")
    held_gpu_hours: float = Field(description="GPU-hours paid for")
    used_gpu_hours: float = Field(description="GPU-hours placement used")
    idle_gpu_hours: float


class CostDayOut(Out):
    day: str = Field(description="UTC date")
    costs: dict[str, float] = Field(description="group → dollars that day")


class ReservationCostOut(Out):
    pool: str
    committed_gpus: int
    price_per_gpu_hour: float
    term_start: str | None
    term_end: str | None
    term_gpu_hours: float | None = Field(description="the whole term's commitment")
    burned_gpu_hours: float | None = Field(description="committed GPU-hours of the term so far")
    remaining_hours: float | None
    paid_gpu_hours: float = Field(description="in the window, from the ledger")
    used_gpu_hours: float
    idle_gpu_hours: float
    idle_fraction: float | None
    idle_cost: float
    expiry_warning_days: int | None = Field(description="30, 7 or 1 (under so many days); 0: ended")


class ApiPriceComparisonOut(Out):
    name: str
    source: str
    input_price_per_mtok: float
    output_price_per_mtok: float
    api_cost: float = Field(description="the window's tokens at this price")
    saving: float = Field(description="api_cost minus the GPU cost (negative: the API is cheaper)")
    break_even_tokens: int | None = Field(
        description="tokens in the window at which the API would cost what the GPUs did"
    )


class TokenCostOut(Out):
    deployment: str
    model_id: str
    input_tokens: int
    output_tokens: int
    cost: float
    dollars_per_mtok: float | None = Field(description="cost per million tokens (in + out)")
    api_prices: list[ApiPriceComparisonOut]


class TcoLineOut(Out):
    name: str
    cost: float
    note: str


class TcoOut(Out):
    gpu: dict[str, float] = Field(description="purchase type → dollars")
    lines: list[TcoLineOut]
    total: float


class RebalanceOut(Out):
    """What the placement would save by moving work onto idle reservations (docs/cost.md)."""

    saving_per_hour: float
    on_demand_and_spot_per_hour_now: float
    on_demand_and_spot_per_hour_fresh: float
    reserved_idle_gpus_now: int
    reserved_idle_gpus_fresh: int
    moved_replicas: int
    unplaced_replicas_now: int
    unplaced_replicas_fresh: int


class CostReportOut(Out):
    from_: str = Field(alias="from")
    to: str
    group_by: str
    total: CostGroupOut
    groups: list[CostGroupOut]
    daily: list[CostDayOut]
    reservations: list[ReservationCostOut]
    rebalance: RebalanceOut
    tokens: list[TokenCostOut]
    tco: TcoOut
