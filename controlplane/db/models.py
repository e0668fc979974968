"""SQLAlchemy rows for the fleet inventory and what the control plane decides and observes.

Managed objects (providers … deployments, tokens) carry `ManagedMixin`; placements, replicas,
instances, events and audit entries are written by the control plane itself.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import Base, ManagedMixin, new_id, utcnow

PRICE = Numeric(14, 6)


class Provider(ManagedMixin, Base):
    __tablename__ = "providers"
    kind: Mapped[str] = mapped_column(String(32))
    provider_class: Mapped[str] = mapped_column(String(16))
    certifications: Mapped[list[Any]] = mapped_column(default=list)
    credentials_ref: Mapped[str | None] = mapped_column(String(255))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)

    regions: Mapped[list[Region]] = relationship(back_populates="provider")


class Region(ManagedMixin, Base):
    __tablename__ = "regions"
    __table_args__ = (UniqueConstraint("provider_id", "code"),)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id", ondelete="RESTRICT"))
    code: Mapped[str] = mapped_column(String(63))
    jurisdiction: Mapped[str] = mapped_column(String(2))
    latitude: Mapped[float] = mapped_column(Float)
    longitude: Mapped[float] = mapped_column(Float)

    # not joined: a pool or cluster needs only the region's own columns
    provider: Mapped[Provider] = relationship(back_populates="regions")


class GpuType(ManagedMixin, Base):
    __tablename__ = "gpu_types"
    memory_gib: Mapped[int] = mapped_column(Integer)


class Pool(ManagedMixin, Base):
    __tablename__ = "pools"
    __table_args__ = (
        CheckConstraint("gpus >= 0", name="gpus_non_negative"),
        CheckConstraint("price_per_gpu_hour >= 0", name="price_non_negative"),
        CheckConstraint(
            "purchase_type IN ('reserved', 'on_demand', 'spot')", name="purchase_type_known"
        ),
    )
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id", ondelete="RESTRICT"))
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id", ondelete="RESTRICT"))
    gpu_type_id: Mapped[str] = mapped_column(ForeignKey("gpu_types.id", ondelete="RESTRICT"))
    purchase_type: Mapped[str] = mapped_column(String(16))
    gpus: Mapped[int] = mapped_column(Integer)
    gpus_per_instance: Mapped[int] = mapped_column(Integer, default=8)
    instance_type: Mapped[str | None] = mapped_column(String(63))
    price_per_gpu_hour: Mapped[Decimal] = mapped_column(PRICE)
    term_start: Mapped[datetime | None]
    term_end: Mapped[datetime | None]
    committed_gpus: Mapped[int | None] = mapped_column(Integer)
    quota_gpus: Mapped[int | None] = mapped_column(Integer)
    interruptions_per_hour: Mapped[Decimal | None] = mapped_column(Numeric(10, 6))
    notice_seconds: Mapped[int | None] = mapped_column(Integer)
    capacity_reservation_id: Mapped[str | None] = mapped_column(String(128))

    provider: Mapped[Provider] = relationship(lazy="joined")
    region: Mapped[Region] = relationship(lazy="joined")
    gpu_type: Mapped[GpuType] = relationship(lazy="joined")


cluster_pools = Table(
    "cluster_pools",
    Base.metadata,
    Column("cluster_id", ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
    Column("pool_id", ForeignKey("pools.id", ondelete="RESTRICT"), primary_key=True),
)


class Cluster(ManagedMixin, Base):
    __tablename__ = "clusters"
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id", ondelete="RESTRICT"))
    endpoint: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    agent_version: Mapped[str | None] = mapped_column(String(32))
    last_heartbeat_at: Mapped[datetime | None]
    desired_generation: Mapped[int] = mapped_column(Integer, default=0)
    desired_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    observed_generation: Mapped[int] = mapped_column(Integer, default=0)
    nats_user: Mapped[str | None] = mapped_column(String(63))
    nats_password_hash: Mapped[str | None] = mapped_column(String(255))

    region: Mapped[Region] = relationship(lazy="joined")
    pools: Mapped[list[Pool]] = relationship(secondary=cluster_pools, lazy="selectin")


class Deployment(ManagedMixin, Base):
    __tablename__ = "deployments"
    model_id: Mapped[str] = mapped_column(String(255))
    model_revision: Mapped[str] = mapped_column(String(128), default="main")
    engine_image: Mapped[str] = mapped_column(String(255))
    engine_args: Mapped[list[Any]] = mapped_column(default=list)
    gpus_per_replica: Mapped[int] = mapped_column(Integer)
    gpu_types: Mapped[list[Any]] = mapped_column(default=list)
    autoscaling: Mapped[dict[str, Any]] = mapped_column(default=dict)
    placement: Mapped[dict[str, Any]] = mapped_column(default=dict)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    traffic: Mapped[dict[str, Any]] = mapped_column(default=dict)
    failover: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    rollout: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    # 0010; None (SQL NULL, not JSON null): no shadow
    shadow: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    shadow_window: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    """The routers' counters (cluster → entry → `OutcomeCounters`) of the deployment and its
    shadow lane when the shadow was last set or changed: the shadow report's window start."""
    revision: Mapped[int] = mapped_column(Integer, default=1)
    demand_replicas: Mapped[int] = mapped_column(Integer, default=0)

    revisions: Mapped[list[DeploymentRevision]] = relationship(
        back_populates="deployment", cascade="all, delete-orphan", passive_deletes=True
    )


class DeploymentRevision(Base):
    __tablename__ = "deployment_revisions"
    __table_args__ = (UniqueConstraint("deployment_id", "revision"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    revision: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow)

    deployment: Mapped[Deployment] = relationship(back_populates="revisions")


class Placement(Base):
    """Replicas of one deployment on one cluster drawing on one pool, as last decided."""

    __tablename__ = "placements"
    __table_args__ = (UniqueConstraint("deployment_id", "cluster_id", "pool_id"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"))
    replicas: Mapped[int] = mapped_column(Integer)
    min_replicas: Mapped[int] = mapped_column(Integer, default=0)
    max_replicas: Mapped[int] = mapped_column(Integer, default=0)
    cost_per_hour: Mapped[Decimal] = mapped_column(PRICE, default=Decimal(0))
    plan_generation: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )


class Instance(Base):
    """A machine we hold in a pool; `idempotency_key` is written before the provider call."""

    __tablename__ = "instances"
    __table_args__ = (Index("ix_instances_pool_state", "pool_id", "state"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="RESTRICT"))
    cluster_id: Mapped[str | None] = mapped_column(ForeignKey("clusters.id", ondelete="SET NULL"))
    provider_instance_id: Mapped[str | None] = mapped_column(String(128))
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    gpus: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="requested")
    health: Mapped[str] = mapped_column(String(16), default="unknown")
    # procurement (0002): when the provider takes it back or we drain it; since when unused
    drain_deadline: Mapped[datetime | None]
    idle_since: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )


class Replica(Base):
    __tablename__ = "replicas"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128))
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="RESTRICT"))
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    instance_id: Mapped[str | None] = mapped_column(ForeignKey("instances.id", ondelete="SET NULL"))
    revision: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[str] = mapped_column(String(16), default="starting")
    endpoint: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )


# The id of the transaction that writes a row (64-bit, never wraps). Rows whose id is below
# every running transaction's are all committed: a cursor on it misses no late commit.
CURRENT_TXID = text("(pg_current_xact_id()::text)::bigint")


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_object", "object_kind", "object_id"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    time: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow, index=True)
    occurred_at: Mapped[datetime | None] = mapped_column()
    """When a fact happened on its plane (its envelope's time, bounded); `time`: received."""
    type: Mapped[str] = mapped_column(String(64))
    object_kind: Mapped[str] = mapped_column(String(32))
    object_id: Mapped[str | None] = mapped_column(String(36))
    object_name: Mapped[str | None] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    txid: Mapped[int | None] = mapped_column(BigInteger, server_default=CURRENT_TXID, index=True)
    """The writing transaction's id: the webhook export's cursor (controlplane/webhook/)."""


class AuditEntry(Base):
    __tablename__ = "audit_entries"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    time: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(16))
    resource_kind: Mapped[str] = mapped_column(String(32))
    resource_id: Mapped[str | None] = mapped_column(String(36))
    resource_name: Mapped[str | None] = mapped_column(String(128))
    before: Mapped[dict[str, Any] | None] = mapped_column()
    after: Mapped[dict[str, Any] | None] = mapped_column()
    request_id: Mapped[str | None] = mapped_column(String(64))
    txid: Mapped[int | None] = mapped_column(BigInteger, server_default=CURRENT_TXID, index=True)
    """The writing transaction's id: the webhook export's cursor (controlplane/webhook/)."""


class ApiToken(ManagedMixin, Base):
    """A bearer token; only the SHA-256 of the secret is stored (secrets are 256-bit random)."""

    __tablename__ = "api_tokens"
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    description: Mapped[str | None] = mapped_column(String(255))
    expires_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)


class DashboardSession(Base):
    """A dashboard sign-in. The cookie carries a random id; only its SHA-256 is stored.
    Logging out deletes the row, so a copy of the cookie stops working; a disabled, expired
    or deleted token ends its sessions; each lasts `SESSION_LIFETIME` at most."""

    __tablename__ = "dashboard_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


class BusProgress(Base):
    """How far the bus process has processed the reports stream, one row per durable
    consumer: the liveness check counts silence only up to `caught_up_at`."""

    __tablename__ = "bus_progress"

    consumer: Mapped[str] = mapped_column(String(63), primary_key=True)
    alive_at: Mapped[datetime]
    caught_up_at: Mapped[datetime | None]
    stream_last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    ack_floor: Mapped[int] = mapped_column(BigInteger, default=0)
    pending: Mapped[int] = mapped_column(Integer, default=0)


class RoutingState(Base):
    """The gateways' routing table's numbering (one row): ``(epoch, generation)`` moves only
    when the table's content (``digest``) changes, like a cluster's desired generation."""

    __tablename__ = "routing_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, default=1)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    digest: Mapped[str] = mapped_column(String(64), default="")
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )


# --- cost (0007) ---------------------------------------------------------------------------

GPU_HOURS = Numeric(20, 9)
MONEY = Numeric(20, 9)


class CostLedger(Base):
    """GPU-hours held and used, and what they cost, per UTC hour per pool per (deployment,
    cluster); deployment and cluster "" for what the pool holds that no placement uses.
    Names, not ids: the ledger outlives what it names. Accrued by `services.costs.accrue`."""

    __tablename__ = "cost_ledger"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    pool: Mapped[str] = mapped_column(String(63), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(63), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    provider: Mapped[str] = mapped_column(String(63))
    region: Mapped[str] = mapped_column(String(63))
    gpu_type: Mapped[str] = mapped_column(String(63))
    purchase_type: Mapped[str] = mapped_column(String(16))
    price_per_gpu_hour: Mapped[Decimal] = mapped_column(PRICE)
    held_gpu_hours: Mapped[Decimal] = mapped_column(GPU_HOURS)
    used_gpu_hours: Mapped[Decimal] = mapped_column(GPU_HOURS)
    cost: Mapped[Decimal] = mapped_column(MONEY)


class CostAccrual(Base):
    """How far the ledger has been accrued (one row); locked while an accrual runs, so two
    workers never count one interval twice."""

    __tablename__ = "cost_accrual"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, default=1)
    accrued_until: Mapped[datetime]


class TokenUsage(Base):
    """Tokens and response bytes the planes' routers served, per UTC hour per deployment
    per cluster (from the counters in each heartbeat, `services.costs.record_usage`)."""

    __tablename__ = "token_usage"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(63), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    response_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    cross_region_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class TokenCounter(Base):
    """The last counters a cluster's router reported for a deployment (`since`: the router's
    start), so the next report's increase is what is new."""

    __tablename__ = "token_counters"

    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(63), primary_key=True)
    since: Mapped[str] = mapped_column(String(64))
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    response_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    cross_region_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )


class ApiPrice(ManagedMixin, Base):
    """A public API's price for a model, to set a deployment's $/Mtok against."""

    __tablename__ = "api_prices"
    model_id: Mapped[str] = mapped_column(String(255))
    input_price_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    output_price_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    source: Mapped[str | None] = mapped_column(String(255))


class WebhookCursor(Base):
    """How far the export of one stream (``event``, ``audit``) to the webhook has come, and
    its delivery counts (the API's /metrics serves them)."""

    __tablename__ = "webhook_cursors"

    stream: Mapped[str] = mapped_column(String(16), primary_key=True)
    txid: Mapped[int] = mapped_column(BigInteger)
    row_id: Mapped[str] = mapped_column(String(36), default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Failed tries of the batch at the cursor; 0 after a delivery."""
    rejections: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Of those, refusals in a row (any other failure resets it): what dead-letters."""
    next_attempt_at: Mapped[datetime | None]
    delivered: Mapped[int] = mapped_column(BigInteger, default=0)
    failed_attempts: Mapped[int] = mapped_column(BigInteger, default=0)
    dead_letters: Mapped[int] = mapped_column(BigInteger, default=0)
    last_error: Mapped[str | None] = mapped_column(String(255))


# --- rollouts (0009) -----------------------------------------------------------------------


class Rollout(Base):
    """One canary of a deployment from its stable revision to a new one (docs/rollouts.md):
    the state `controlplane.rollouts` decides on, as last decided. At most one per deployment
    is not finished; a later change of the revision ends it (superseded)."""

    __tablename__ = "rollouts"
    __table_args__ = (Index("ix_rollouts_deployment_created", "deployment_id", "created_at"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    from_revision: Mapped[int] = mapped_column(Integer)
    to_revision: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(16))
    policy: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """The deployment's `rollout` spec when it started: a later edit does not move its steps."""
    phase: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer, default=0)
    since: Mapped[datetime]
    reason: Mapped[str] = mapped_column(Text, default="")
    paused_from: Mapped[str | None] = mapped_column(String(16))
    window_start: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """cluster → entry name → `OutcomeCounters` when the current hold began."""
    last_windows: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """The gates' inputs at the last look (`stable`, `new`: `rollouts.Window` as JSON)."""
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )
    finished_at: Mapped[datetime | None]


class RouterOutcomes(Base):
    """The last `OutcomeCounters` a cluster's router reported for one desired-state entry
    (a deployment or a rollout lane): a rollout's windows are differences of these."""

    __tablename__ = "router_outcomes"

    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    entry: Mapped[str] = mapped_column(String(128), primary_key=True)
    counters: Mapped[dict[str, Any]] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), default=utcnow, onupdate=utcnow
    )
