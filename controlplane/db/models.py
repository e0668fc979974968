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
)
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
