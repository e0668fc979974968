"""Messages between the control plane and workload planes, and where they travel on NATS.

Pure pydantic; imports nothing else of the project (the workload plane imports this module).
Compatibility within v1: only additive fields, each with a default; consumers ignore
unknown fields (``extra="ignore"``); a message whose ``schema_version`` is not
``SCHEMA_VERSION`` is rejected by the reader, never half-understood.
"""

from __future__ import annotations

import errno
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

SCHEMA_VERSION = 1

# --- NATS names (the only place they are spelled) -----------------------------------------

SUBJECT_PREFIX = "gpufleet.v1"
DESIRED_BUCKET = "gpufleet_v1_desired"
"""JetStream KV bucket holding one DesiredState snapshot per cluster (key = cluster name)."""
DESIRED_STREAM = f"KV_{DESIRED_BUCKET}"
"""The stream JetStream creates behind the KV bucket."""
REPORTS_STREAM = "GPUFLEET_V1_REPORTS"
"""Stream holding observed state and facts of every cluster."""
REPORTS_SUBJECTS = (
    f"{SUBJECT_PREFIX}.cluster.*.observed",
    f"{SUBJECT_PREFIX}.cluster.*.fact.*",
)

CLUSTER_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")

ROUTES_BUCKET = "gpufleet_v1_routes"
"""JetStream KV bucket holding the gateways' routing table: one snapshot under ROUTES_KEY."""
ROUTES_STREAM = f"KV_{ROUTES_BUCKET}"
ROUTES_KEY = "table"
ROUTES_SUBJECT = f"$KV.{ROUTES_BUCKET}.{ROUTES_KEY}"
PLANE_LOAD_SUBJECTS = f"{SUBJECT_PREFIX}.cluster.*.load"
"""Core NATS (not JetStream: a lost load report is replaced by the next one a second later)."""
MAX_ROUTES_BYTES = 4 * 1024 * 1024
"""Largest routing table a gateway accepts (the bucket's max value size)."""
MAX_PLANE_LOAD_BYTES = 256 * 1024
"""Largest load report a gateway accepts; a bigger one is dropped and counted."""
MAX_REPORT_BYTES = 8 * 1024 * 1024
"""A plane's report (heartbeat or fact): bounded whatever NATS's max_payload is raised to."""
MAX_REPORT_REPLICAS = 65_536
MAX_REPORT_ENTRIES = 4096
"""Deployments, pools, and waiting deployments per pool, in one heartbeat."""


SECRET_ENV_WORDS = ("PASSWORD", "SECRET", "CREDENTIAL", "CREDS", "PRIVATE_KEY", "ACCESS_KEY",
                    "SESSION_TOKEN", "WEBHOOK")  # fmt: skip
"""Words that mark an environment variable as a secret no workload-plane process (agent,
router, gateway, engine) inherits: cloud keys (AWS_SECRET_ACCESS_KEY, AZURE_CLIENT_SECRET,
GOOGLE_APPLICATION_CREDENTIALS), a provider's `credentials_ref: env:NAME` when NAME says
what it is (docs/procurement.md), the events webhook. HF_TOKEN stays: engines load models
with it."""


def secret_env(name: str) -> bool:
    """Whether the environment variable ``name`` is a secret (SECRET_ENV_WORDS)."""
    upper = name.upper()
    return any(word in upper for word in SECRET_ENV_WORDS)


def strip_userinfo(url: str) -> str:
    """``url`` (or a comma-separated list of them, as NATS takes) without any
    ``user:password@``: for a log line, an error message, or a process that has credentials
    of its own."""
    out = []
    for one in url.split(","):
        scheme, sep, rest = one.partition("://")
        if not sep:
            scheme, rest = "", one
        if "@" in rest:  # a password may hold "/" (or "?", "#") unescaped: cut to the last "@"
            rest = rest.rpartition("@")[2]
        out.append(f"{scheme}{sep}{rest}")
    return ",".join(out)


def desired_key(cluster: str) -> str:
    """KV key of a cluster's desired state."""
    return check_cluster_name(cluster)


def desired_subject(cluster: str) -> str:
    """The stream subject behind a cluster's desired-state key."""
    return f"$KV.{DESIRED_BUCKET}.{check_cluster_name(cluster)}"


def cluster_subject_prefix(cluster: str) -> str:
    """Every subject a cluster may publish on starts with this."""
    return f"{SUBJECT_PREFIX}.cluster.{check_cluster_name(cluster)}"


def observed_subject(cluster: str) -> str:
    return f"{cluster_subject_prefix(cluster)}.observed"


def fact_subject(cluster: str, fact_type: str) -> str:
    return f"{cluster_subject_prefix(cluster)}.fact.{fact_type}"


def cluster_from_subject(subject: str) -> str | None:
    """The cluster named in a reports subject, or None if the subject is not one of ours."""
    parts = subject.split(".")
    if len(parts) < 5 or ".".join(parts[:3]) != f"{SUBJECT_PREFIX}.cluster":
        return None
    return parts[3]


def cluster_user(cluster: str) -> str:
    """The NATS user of a cluster's agent."""
    return f"cluster-{check_cluster_name(cluster)}"


def cluster_inbox_prefix(cluster: str) -> str:
    """Inbox prefix a cluster's agent must connect with: replies and watch deliveries land
    under it, and only that cluster may subscribe there."""
    return f"_INBOX_{check_cluster_name(cluster)}"


def plane_load_subject(cluster: str) -> str:
    """Where a plane publishes its load (>= 1 Hz) for the gateways."""
    return f"{cluster_subject_prefix(cluster)}.load"


def gateway_user(gateway: str) -> str:
    """The NATS user of one gateway (read-only: the routing table and plane load)."""
    return f"gateway-{check_cluster_name(gateway)}"


def gateway_inbox_prefix(gateway: str) -> str:
    """Inbox prefix of a gateway: upper case, so that no cluster's `_INBOX_<name>` (lower
    case only) can be it (`_INBOX_gateway-<name>` was a cluster named `gateway-<name>`'s)."""
    return f"_INBOX_GW_{check_cluster_name(gateway)}"


def check_cluster_name(name: str) -> str:
    """Return ``name`` if it is a valid cluster name (one NATS token, DNS-label shaped)."""
    if not CLUSTER_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid cluster name {name!r}: use 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit"
        )
    return name


def utcnow() -> datetime:
    return datetime.now(UTC)


# --- building blocks ----------------------------------------------------------------------


class Model(BaseModel):
    """Base of every contract model: unknown fields are ignored (forward compatibility)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


ClusterName = Annotated[str, Field(pattern=CLUSTER_NAME_RE.pattern)]


def _no_nul(value: str) -> str:
    if "\x00" in value:  # PostgreSQL's text refuses it: the report would fail for ever
        raise ValueError("a NUL character is not allowed")
    return value


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    """A time in UTC (one without a zone is taken as UTC: it could not be compared with
    ours), brought within 1970-2999: PostgreSQL stores a time before year 1 (year 1 at
    +01:00) but the driver cannot read it back, and every later read of its table failed.
    Brought in, not refused: the rest of the report is still true."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 across the offset
        return EARLIEST if value.year < 2000 else LATEST
    return min(max(value, EARLIEST), LATEST)


# What a plane reports is bounded to what the database keeps (names and ids 128 characters,
# BIGINT counters) and holds no NUL: a value the database refuses would make the report
# fail on every redelivery (controlplane/services/observed.py keeps a net under this).
Id = Annotated[str, Field(max_length=128), AfterValidator(_no_nul)]
Text = Annotated[str, Field(max_length=1024), AfterValidator(_no_nul)]
COUNT_MAX = 2**63 - 1
"""The largest counter a report carries (a signed 64-bit column)."""
Count = Annotated[int, Field(ge=0, le=COUNT_MAX)]
When = Annotated[datetime, AfterValidator(_utc)]
EntryName = Annotated[str, Field(max_length=80, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")]
"""A deployment or lane (``NAME--r3``, ``NAME--shadow``) in a desired state: a DNS label as
the API takes it, its suffix, nothing a path or a replica id cannot hold."""
RevisionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")]
REPLICAS_MAX = 10_000
"""The most replicas a quota may name (the API's ``max_replicas`` bound)."""


class Envelope(Model):
    """Fields every message carries. ``id`` doubles as the JetStream ``Nats-Msg-Id``."""

    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    type: str
    schema_version: int = SCHEMA_VERSION
    source: str = Field(pattern=r"^(controlplane|cluster/[a-z0-9-]+)$")
    time: When = Field(default_factory=utcnow)
    cluster: ClusterName


class RevisionSpec(Model):
    """What one replica of a deployment revision runs."""

    model_id: str
    revision: RevisionName = Field(description="revision identifier; a change means a new revision")
    engine_image: str = ""
    engine_args: list[str] = Field(default_factory=list)
    gpu_types: list[str] = Field(default_factory=list, description="acceptable GPU types")
    gpus_per_replica: int = Field(default=1, ge=0)


class ReplicaQuota(Model):
    min: int = Field(default=0, ge=0, le=REPLICAS_MAX)
    max: int = Field(default=0, ge=0, le=REPLICAS_MAX)

    @field_validator("max")
    @classmethod
    def _max_not_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min", 0)
        if value < low:
            raise ValueError(f"max ({value}) must be >= min ({low})")
        return value


class ScheduleWindow(Model):
    """Raise min replicas to ``min_replicas`` on ``days`` (0 = Monday) from ``start`` to
    ``end`` ("HH:MM", local time in ``timezone``); ``end <= start`` spans midnight."""

    days: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4])
    start: str
    end: str
    timezone: str = "UTC"
    min_replicas: int = Field(default=0, ge=0)


class AutoscalingPolicy(Model):
    window_seconds: float = Field(default=60.0, gt=0)
    scale_down_delay_seconds: float = Field(default=300.0, ge=0)
    target_concurrency: float = Field(default=8.0, gt=0)
    scale_to_zero_idle_seconds: float | None = Field(
        default=None, description="None: never scale to zero"
    )
    schedule: list[ScheduleWindow] = Field(
        default_factory=list, description="predictive pre-scaling: min replicas by time of day"
    )


class PoolQuota(Model):
    """The replicas of one deployment that one capacity pool carries on this cluster."""

    pool: str
    min: int = Field(default=0, ge=0, le=REPLICAS_MAX)
    max: int = Field(default=0, ge=0, le=REPLICAS_MAX)


class DeploymentDesired(Model):
    """One deployment as placed on one cluster."""

    name: EntryName
    spec: RevisionSpec
    quota: ReplicaQuota = Field(default_factory=ReplicaQuota)
    pools: list[str] = Field(default_factory=list, description="capacity pools it may draw on")
    pool_quotas: list[PoolQuota] = Field(
        default_factory=list,
        description="per-pool split of the quota, most preferred pool first; empty: any pool",
    )
    hold_leaving: int = Field(
        default=0,
        ge=0,
        le=REPLICAS_MAX,
        description="replicas on draining instances to keep serving until their replacements "
        "on other clusters are ready (a draining instance's deadline still wins)",
    )
    routing_weight: float = Field(default=1.0, ge=0, description="share of global traffic")
    priority: int = 0
    autoscaling: AutoscalingPolicy = Field(default_factory=AutoscalingPolicy)
    serves: str = Field(
        default="",
        max_length=128,
        description="a rollout lane: the deployment whose requests this entry's replicas "
        "answer (they serve that model name); empty: its own name (added within v1)",
    )
    traffic_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="a lane's share of the requests for ``serves`` on this plane (sticky per "
        "session key); the served deployment takes the rest (added within v1)",
    )
    mirror: bool = Field(
        default=False,
        description="a shadow lane: it gets a copy of ``traffic_share`` of the requests for "
        "``serves``, fire and forget, and its answers are discarded (added within v1)",
    )


ReplicaState = Literal["starting", "ready", "draining", "failed"]


class ReplicaStatus(Model):
    replica_id: Id
    deployment: Id
    revision: Id
    state: ReplicaState
    endpoint: Annotated[str, Field(max_length=255), AfterValidator(_no_nul)] | None = None
    started_at: When | None = None
    pool: Id | None = Field(default=None, description="capacity pool whose GPUs it uses")
    instance: Id | None = Field(default=None, description="provider instance id it runs on")
    serves: str = Field(
        default="",
        max_length=128,
        description="a rollout lane's replica: the deployment whose name it answers "
        "(added within v1)",
    )


class InstanceDesired(Model):
    """A machine the control plane holds for this cluster. ``drain_deadline``: the provider
    takes it back then (spot notice) or it is cordoned (unhealthy): replicas move off it."""

    id: str = Field(description="provider instance id")
    pool: str
    gpus: int = Field(default=0, ge=0)
    draining: bool = False
    drain_deadline: When | None = None


class TokenCounters(Model):
    """What the plane's router has served for one deployment since it started (``since``
    names that start: a new value means the counters began again from zero). Counters, not
    increments, so that a lost or repeated heartbeat neither loses nor doubles a token.
    Counts only: never a prompt or a completion."""

    since: Annotated[str, Field(max_length=64), AfterValidator(_no_nul)]
    input_tokens: Count = 0
    output_tokens: Count = 0
    response_bytes: Count = 0
    cross_region_bytes: Count = Field(
        default=0,
        description="of those, bytes of answers a gateway sent to a client in "
        "another region (added within v1)",
    )


LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
"""Upper bounds of ``OutcomeCounters``' latency buckets (a last one counts the rest)."""


class OutcomeCounters(Model):
    """What one deployment's (or rollout lane's) requests came to on a plane's router since
    ``since`` (a restarted router starts again from zero): counters, so a window is the
    difference of two reports. Counts only, never content."""

    since: Annotated[str, Field(max_length=64), AfterValidator(_no_nul)]
    requests: Count = 0
    errors: Count = Field(default=0, description="5xx answers and engine errors mid-stream")
    ttft_buckets: list[Count] = Field(
        default_factory=list,
        max_length=len(LATENCY_BUCKETS_S) + 1,
        description="requests by time to first byte, per LATENCY_BUCKETS_S (+ the rest)",
    )
    e2e_buckets: list[Count] = Field(
        default_factory=list,
        max_length=len(LATENCY_BUCKETS_S) + 1,
        description="requests by end-to-end time, per LATENCY_BUCKETS_S (+ the rest)",
    )
    dropped: Count = Field(
        default=0,
        description="a shadow lane's copies the router dropped (too many in flight, or its "
        "queue full): never sent, not in ``requests`` (added within v1)",
    )


class DeploymentObserved(Model):
    name: Id
    demand: Count = Field(default=0, description="replicas the autoscaler wants, even > max")
    in_flight: Count = 0
    queue_depth: Count = 0
    tokens_per_second: float = Field(default=0.0, ge=0, le=1e15)
    utilisation: float = Field(default=0.0, ge=0, le=1e6)
    usage: TokenCounters | None = Field(
        default=None, description="the router's token and byte counters (added within v1)"
    )
    outcomes: OutcomeCounters | None = Field(
        default=None,
        description="the router's request outcomes and latencies: a rollout's gates "
        "(added within v1)",
    )


class FreeCapacity(Model):
    """What a plane has in one pool, as its runtime sees it (placement never counts more
    there than ``total_gpus``). ``gpus``: free now. ``waiting_replicas``: replicas, per
    deployment, that the desired state puts in this pool but that cannot start for lack of
    GPUs (placement moves them elsewhere)."""

    gpu_type: Id
    pool: Id | None = None
    gpus: Count
    total_gpus: Count | None = Field(
        default=None, description="GPUs the plane can use in this pool (None: unknown)"
    )
    waiting_replicas: dict[Id, Count] = Field(
        default_factory=dict,
        max_length=MAX_REPORT_ENTRIES,
        description="per deployment: replicas that cannot start here",
    )


class NatsCredentials(Model):
    """How one party logs into NATS. Passed to ``nats.connect(**creds.connect_options())``."""

    user: str
    password: str = Field(repr=False)
    inbox_prefix: str = "_INBOX"

    def connect_options(self) -> dict[str, str]:
        return {"user": self.user, "password": self.password, "inbox_prefix": self.inbox_prefix}


# --- the global gateway: routing table (control plane -> gateways) and plane load ------------

FailoverMode = Literal["active_active", "active_passive"]
PlaneRole = Literal["active", "standby"]


class PlaneRoute(Model):
    """One plane that serves one deployment, as the gateways need to know it."""

    cluster: ClusterName
    endpoint: str = Field(description="the plane router's base URL, e.g. http://10.0.0.5:8200")
    region: str
    provider: str = ""
    jurisdiction: str = Field(description="ISO 3166-1 alpha-2 of the plane's region")
    latitude: float = Field(ge=-90, le=90)
    longitude: float = Field(ge=-180, le=180)
    role: PlaneRole = "active"
    replicas: int = Field(default=0, ge=0, description="replicas placed there (desired)")
    revision_weights: dict[str, float] = Field(
        default_factory=dict, description="revision -> share of this plane's traffic; empty: all"
    )


class DeploymentRoute(Model):
    """Where one deployment (the OpenAI ``model`` name) may be served."""

    name: str
    failover: FailoverMode = "active_active"
    hold_down_seconds: float = Field(
        default=30.0, ge=0, description="active_passive: primary healthy this long before return"
    )
    jurisdictions: list[str] = Field(
        default_factory=list, description="the deployment's residency; empty: anywhere"
    )
    planes: list[PlaneRoute] = Field(default_factory=list)


class RegionPoint(Model):
    """A region's place on the map: what ``x-gpufleet-client-region`` and a gateway's own
    ``--region`` name, turned into a latitude/longitude for the latency model."""

    name: str
    latitude: float = Field(ge=-90, le=90)
    longitude: float = Field(ge=-180, le=180)
    jurisdiction: str = ""


class RoutingTable(Model):
    """Control plane -> every gateway: one snapshot, newest ``(epoch, generation)`` wins
    (the same level-based rule as DesiredState)."""

    type: Literal["routing_table"] = "routing_table"
    schema_version: int = SCHEMA_VERSION
    source: Literal["controlplane"] = "controlplane"
    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    time: datetime = Field(default_factory=utcnow)
    generation: int = Field(ge=1)
    epoch: int = Field(default=0, ge=0)
    deployments: list[DeploymentRoute] = Field(default_factory=list)
    regions: list[RegionPoint] = Field(
        default_factory=list, description="every region of the fleet (client/gateway regions)"
    )

    @property
    def version(self) -> tuple[int, int]:
        return (self.epoch, self.generation)


LOAD_MAX = 10**9


class DeploymentLoad(Model):
    """One deployment's load on one plane, as its router sees it now."""

    # bounded far above any plane: a gateway ranks with these numbers (10**400 overflowed
    # its float arithmetic and failed every request of the deployment)
    name: Id
    ready_replicas: int = Field(default=0, ge=0, le=LOAD_MAX)
    starting_replicas: int = Field(default=0, ge=0, le=LOAD_MAX)
    in_flight: int = Field(default=0, ge=0, le=LOAD_MAX)
    queue_depth: int = Field(default=0, ge=0, le=LOAD_MAX)
    capacity: int = Field(
        default=0,
        ge=0,
        le=LOAD_MAX,
        description="requests it can run at once (ready replicas x concurrency)",
    )
    ttft_seconds: float | None = Field(
        default=None, ge=0, le=86_400, description="recent median TTFT"
    )
    service_rate: float = Field(
        default=0.0, ge=0, le=LOAD_MAX, description="requests completed per second, recent window"
    )


# Plane load is an Envelope (source "cluster/<name>") defined after it below.


# --- messages -----------------------------------------------------------------------------


class DesiredState(Envelope):
    """Control plane → one cluster: the full snapshot; the newest ``(epoch, generation)``
    wins: a newer epoch regardless of generation, within one epoch the higher generation."""

    type: Literal["desired_state"] = "desired_state"
    source: str = "controlplane"
    generation: int = Field(ge=1, le=2**63 - 1)
    epoch: int = Field(
        default=0,
        ge=0,
        le=2**63 - 1,
        description="the control plane's numbering of this cluster's generations; it starts a "
        "new epoch when it finds a generation it never issued (added within v1)",
    )
    deployments: list[DeploymentDesired] = Field(default_factory=list)
    instances: list[InstanceDesired] = Field(default_factory=list)
    retired: list[EntryName] = Field(
        default_factory=list,
        description="deployments a user deleted recently: drained at once, never kept serving "
        "through the plane's disappearance grace period (added within v1)",
    )

    @field_validator("deployments")
    @classmethod
    def _names_once(cls, value: list[DeploymentDesired]) -> list[DeploymentDesired]:
        seen: set[str] = set()
        for d in value:
            if d.name in seen:  # two entries would each stop the other's replicas
                raise ValueError(f"deployment {d.name} is listed twice")
            seen.add(d.name)
        return value

    @property
    def version(self) -> tuple[int, int]:
        """``(epoch, generation)``: what "newer" compares."""
        return (self.epoch, self.generation)


class ObservedState(Envelope):
    """Cluster → control plane heartbeat, every few seconds."""

    type: Literal["observed_state"] = "observed_state"
    observed_generation: Count = 0
    observed_epoch: Count = Field(default=0, description="epoch of observed_generation")
    agent_version: Annotated[str, Field(max_length=32), AfterValidator(_no_nul)] = ""
    replicas: list[ReplicaStatus] = Field(default_factory=list, max_length=MAX_REPORT_REPLICAS)
    deployments: list[DeploymentObserved] = Field(
        default_factory=list, max_length=MAX_REPORT_ENTRIES
    )
    free_capacity: list[FreeCapacity] = Field(default_factory=list, max_length=MAX_REPORT_ENTRIES)


class ReplicaStarted(Envelope):
    type: Literal["replica_started"] = "replica_started"
    replica: ReplicaStatus


class ReplicaFailed(Envelope):
    type: Literal["replica_failed"] = "replica_failed"
    replica: ReplicaStatus
    reason: Text = ""


class SpotInterruptionNoticed(Envelope):
    type: Literal["spot_interruption_noticed"] = "spot_interruption_noticed"
    instance_id: Id
    pool: Id | None = None
    deadline: When | None = None


class NodeUnhealthy(Envelope):
    type: Literal["node_unhealthy"] = "node_unhealthy"
    instance_id: Id
    reason: Text = ""


class CapacityExhausted(Envelope):
    type: Literal["capacity_exhausted"] = "capacity_exhausted"
    deployment: Id
    pool: Id | None = None
    wanted: Count = 0
    reason: Text = ""


class ReplicasScaled(Envelope):
    """The plane's autoscaler changed a deployment's replica count inside its quota."""

    type: Literal["replicas_scaled"] = "replicas_scaled"
    deployment: Id
    from_replicas: Count = 0
    to_replicas: Count = 0
    reason: Text = ""
    panic: bool = False


class DesiredStateApplied(Envelope):
    type: Literal["desired_state_applied"] = "desired_state_applied"
    generation: int = Field(ge=1, le=COUNT_MAX)
    epoch: Count = Field(default=0, description="epoch of the generation applied")


class DeploymentKept(Envelope):
    """A newer snapshot dropped a deployment that still had traffic here: the plane keeps
    serving it until ``until`` (its disappearance grace period) unless a snapshot retires
    it or places it again."""

    type: Literal["deployment_kept"] = "deployment_kept"
    deployment: Id
    until: When
    reason: Text = ""


MAX_PLANE_LOAD_DEPLOYMENTS = 4096


class PlaneLoad(Envelope):
    """Plane -> gateways, >= 1 Hz on ``plane_load_subject(cluster)`` (core NATS)."""

    type: Literal["plane_load"] = "plane_load"
    sequence: int = Field(default=0, ge=0, le=2**63 - 1, description="increases by one per report")
    interval_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="the publisher's period (at most a minute: a gateway counts missed "
        "reports by it)",
    )
    deployments: list[DeploymentLoad] = Field(
        default_factory=list,
        max_length=MAX_PLANE_LOAD_DEPLOYMENTS,
        description="a gateway looks a deployment up here on every request it routes",
    )


Fact = Annotated[
    ReplicaStarted
    | ReplicaFailed
    | SpotInterruptionNoticed
    | NodeUnhealthy
    | CapacityExhausted
    | DesiredStateApplied
    | ReplicasScaled
    | DeploymentKept,
    Field(discriminator="type"),
]
Report = Annotated[
    ObservedState
    | ReplicaStarted
    | ReplicaFailed
    | SpotInterruptionNoticed
    | NodeUnhealthy
    | CapacityExhausted
    | DesiredStateApplied
    | ReplicasScaled
    | DeploymentKept,
    Field(discriminator="type"),
]

MESSAGE_TYPES: tuple[type[Envelope], ...] = (
    DesiredState,
    ObservedState,
    ReplicaStarted,
    ReplicaFailed,
    SpotInterruptionNoticed,
    NodeUnhealthy,
    CapacityExhausted,
    DesiredStateApplied,
    ReplicasScaled,
    DeploymentKept,
)
FACT_TYPES: tuple[type[Envelope], ...] = MESSAGE_TYPES[2:]
FACT_TYPE_NAMES: tuple[str, ...] = tuple(t.model_fields["type"].default for t in FACT_TYPES)
"""Each fact's ``type``: the last token of its subject (`fact_subject`)."""

_REPORT = TypeAdapter(Report)


class RejectedMessageError(ValueError):
    """A message we cannot accept; ``reason`` is a short label for metrics."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def loads(data: bytes | str) -> Any:
    """``json.loads`` for input from outside the process: JSON nested deeper than the
    parser's recursion limit (~1,000 levels) raises ValueError like any other malformed
    JSON, not RecursionError (which no caller expects: a 500, a dead task)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply: the parser stops at about 1,000 levels") from None


def read_small_file(path: Path, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of a regular file (the caller refuses more): a secrets
    or keys file named on a command line. Raises OSError (``strerror`` says why) for a
    missing file, or a FIFO, device or directory without reading it: one would block,
    another never end."""
    if not path.is_file():
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    with path.open("rb") as f:
        return f.read(limit + 1)


def whole_number(text: str, max_digits: int = 18) -> int | None:
    """``text`` as a non-negative integer of at most ``max_digits`` ASCII digits, else None.
    For input from outside the process: ``str.isdigit`` takes "²", which ``int`` refuses,
    and ``int`` refuses more than 4,300 digits (both were 500s)."""
    if text.isascii() and text.isdigit() and len(text) <= max_digits:
        return int(text)
    return None


def _check_version(data: bytes) -> dict:
    try:
        raw = loads(data)
    except ValueError as exc:
        raise RejectedMessageError("malformed", f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise RejectedMessageError("malformed", "not a JSON object")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RejectedMessageError(
            "schema_version",
            f"schema_version {version!r} is not {SCHEMA_VERSION}; upgrade the older side",
        )
    return raw


def _describe(exc: ValidationError) -> str:
    """The first problem as 'field.path: message' (what to fix), plus how many more."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "message"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def decode_report(data: bytes) -> ObservedState | Fact:
    """Parse a cluster → control plane message, or raise RejectedMessageError."""
    if len(data) > MAX_REPORT_BYTES:
        raise RejectedMessageError(
            "oversized", f"{len(data)} bytes is over the {MAX_REPORT_BYTES}-byte limit"
        )
    return _validated(data, _REPORT.validate_json, _REPORT.validate_python)


def decode_desired(data: bytes) -> DesiredState:
    """Parse a DesiredState snapshot, or raise RejectedMessageError."""
    return _validated(data, DesiredState.model_validate_json, DesiredState.model_validate)


def _validated(
    data: bytes, from_json: Callable[[bytes], Any], from_dict: Callable[[dict], Any]
) -> Any:
    """A message from its bytes, or RejectedMessageError naming what is wrong.

    A well-formed message of this schema version is validated straight from its bytes
    (pydantic's JSON parser: half the time of ``json.loads`` and then validating the dict;
    desired states and facts are on the desired → applied path); anything else takes the
    slow path, which tells malformed JSON, another schema version and an invalid field
    apart."""
    try:
        message = from_json(data)
    except ValidationError:
        pass
    else:
        if getattr(message, "schema_version", None) == SCHEMA_VERSION:
            return message
    raw = _check_version(data)
    try:
        return from_dict(raw)
    except ValidationError as exc:
        raise RejectedMessageError("invalid", _describe(exc)) from exc


def encode(message: Envelope) -> bytes:
    return message.model_dump_json().encode()


def _decode_bounded(data: bytes, limit: int, model: type[BaseModel]) -> BaseModel:
    if len(data) > limit:
        raise RejectedMessageError("oversized", f"{len(data)} bytes is over the {limit}-byte limit")
    return _validated(data, model.model_validate_json, model.model_validate)


def decode_routing_table(data: bytes) -> RoutingTable:
    """Parse the gateways' routing table, or raise RejectedMessageError."""
    table = _decode_bounded(data, MAX_ROUTES_BYTES, RoutingTable)
    assert isinstance(table, RoutingTable)
    return table


def decode_plane_load(data: bytes) -> PlaneLoad:
    """Parse a plane's load report, or raise RejectedMessageError."""
    load = _decode_bounded(data, MAX_PLANE_LOAD_BYTES, PlaneLoad)
    assert isinstance(load, PlaneLoad)
    return load
