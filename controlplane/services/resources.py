"""How each user-managed kind maps between its spec (names) and its rows (ids).

One `ResourceKind` per kind; the generic service in `inventory.py` does the rest. Loading a
spec from a row and applying a spec to a row are inverse: apply(load(row)) changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, delete, func, select
from sqlalchemy.orm import Session

from controlplane.db import models as m
from controlplane.db.columns import cluster_status, deployment_failover, set_status
from controlplane.errors import BadRequest, InUse, InvalidSpec
from controlplane.procurement.core import HELD
from controlplane.services.desired import removing_cluster, removing_deployment, removing_pool
from controlplane.specs import (
    ApiPriceSpec,
    ClusterSpec,
    DeploymentSpec,
    GpuTypeSpec,
    PoolSpec,
    ProviderSpec,
    RegionSpec,
    Role,
    Spec,
    TokenSpec,
)

Filter = Callable[[Select[Any], str], Select[Any]]


def _affects_no_cluster(session: Session, row: Any) -> set[str]:
    return set()


@dataclass(frozen=True)
class ResourceKind:
    kind: str
    path: str
    row: type[Any]
    spec: type[Spec]
    write_role: Role
    load: Callable[[Any], dict[str, Any]]
    apply: Callable[[Session, Any, Any], None]
    check_delete: Callable[[Session, Any, bool], None]
    filters: Mapping[str, Filter] = field(default_factory=dict)
    read_role: Role = Role.viewer
    removing: Callable[[Session, Any], set[str]] = _affects_no_cluster
    """Ids of the clusters whose desired state changes when the row is deleted; asked
    before the rows go (their placements and replicas are deleted with them)."""
    core_writes: bool = False
    """An update (PATCH, PUT of an existing object) reads and writes the row with Core
    (`services.rowviews`): `load` and `apply` touch only its columns and its many-to-one
    references, and a change needs no ORM object (no collection, no revision history)."""


def _by_name(session: Session, row_type: type[Any], name: str, field_name: str) -> Any:
    found = session.scalars(select(row_type).where(row_type.name == name)).first()
    if found is None:
        kind = row_type.__tablename__.rstrip("s").replace("_", " ")
        raise InvalidSpec.on(
            field_name, f"no {kind} named '{name}'; create it first or fix the name"
        )
    return found


def _loaded(current: Any, name: str) -> Any:
    """`current` (a row already loaded with the one being written) if it is the one `name`
    refers to: a write that keeps its references looks none of them up again."""
    return current if current is not None and current.name == name else None


def _referenced(
    session: Session, current: Any, row_type: type[Any], name: str, field_name: str
) -> Any:
    return _loaded(current, name) or _by_name(session, row_type, name, field_name)


def _names(rows: list[Any]) -> str:
    shown = ", ".join(f"`{r.name}`" for r in rows[:5])
    return shown + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")


def _refuse_if(rows: list[Any], what: str, fix: str) -> None:
    if rows:
        raise InUse(f"still {what} {_names(rows)}; {fix}")


def eq_filter(column: Any) -> Filter:
    """`?key=value` → column equals value."""
    return lambda stmt, value: stmt.where(column == value)


def time_filter(column: Any, after: bool) -> Filter:
    """`?since=…` / `?until=…` (ISO 8601; UTC when no offset is given) → at or after / before."""

    def apply(stmt: Select[Any], value: str) -> Select[Any]:
        try:
            at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
        except (ValueError, OverflowError):
            raise BadRequest(
                f"'{value[:40]}' is not a time; use ISO 8601, e.g. 2026-01-31T12:00:00Z"
            ) from None
        return stmt.where(column >= at if after else column <= at)

    return apply


def ref_filter(column: Any, row_type: type[Any]) -> Filter:
    """`?key=name` → the foreign key points at the row of that name."""
    return lambda stmt, value: stmt.where(
        column.in_(select(row_type.id).where(row_type.name == value))
    )


def _contains(column: Any) -> Filter:
    return lambda stmt, value: stmt.where(column.contains([value]))


# providers ---------------------------------------------------------------------------------


def _load_provider(row: m.Provider) -> dict[str, Any]:
    return {
        "name": row.name,
        "provider_kind": row.kind,
        "provider_class": row.provider_class,
        "certifications": row.certifications,
        "credentials_ref": row.credentials_ref,
        "labels": row.labels,
    }


def _apply_provider(session: Session, row: m.Provider, spec: ProviderSpec) -> None:
    if row.id is not None and row.kind != spec.provider_kind.value:
        pools = select(m.Pool.id).where(m.Pool.provider_id == row.id)
        if held := _held(session, pools):
            raise InUse(
                f"its pools hold {held} instance(s) of a {row.kind} account: its "
                "provider_kind cannot change under them; release them first"
            )
    row.name = spec.name
    row.kind = spec.provider_kind.value
    row.provider_class = spec.provider_class.value
    row.certifications = list(spec.certifications)
    row.credentials_ref = spec.credentials_ref
    row.labels = dict(spec.labels)


def _check_delete_provider(session: Session, row: m.Provider, force: bool) -> None:
    pools = list(session.scalars(select(m.Pool).where(m.Pool.provider_id == row.id)))
    _refuse_if(pools, "has pools", "delete those pools first")
    regions = list(session.scalars(select(m.Region).where(m.Region.provider_id == row.id)))
    _refuse_if(regions, "has regions", "delete those regions first")


# regions -----------------------------------------------------------------------------------


def _load_region(row: m.Region) -> dict[str, Any]:
    return {
        "name": row.name,
        "provider": row.provider.name,
        "code": row.code,
        "jurisdiction": row.jurisdiction,
        "latitude": row.latitude,
        "longitude": row.longitude,
    }


def _apply_region(session: Session, row: m.Region, spec: RegionSpec) -> None:
    provider = _by_name(session, m.Provider, spec.provider, "provider")
    clash = session.scalars(
        select(m.Region).where(
            m.Region.provider_id == provider.id, m.Region.code == spec.code, m.Region.id != row.id
        )
    ).first()
    if clash is not None:
        raise InvalidSpec.on(
            "code", f"provider '{spec.provider}' already has region '{clash.name}' with this code"
        )
    row.name, row.provider, row.code = spec.name, provider, spec.code
    row.jurisdiction, row.latitude, row.longitude = spec.jurisdiction, spec.latitude, spec.longitude


def _check_delete_region(session: Session, row: m.Region, force: bool) -> None:
    pools = list(session.scalars(select(m.Pool).where(m.Pool.region_id == row.id)))
    _refuse_if(pools, "has pools", "delete those pools first")
    clusters = list(session.scalars(select(m.Cluster).where(m.Cluster.region_id == row.id)))
    _refuse_if(clusters, "hosts clusters", "delete those clusters first")
    named = select(m.Deployment).where(
        m.Deployment.placement["allowed_regions"].contains([row.name])
        | m.Deployment.traffic.has_key(row.name)
    )
    _refuse_if(
        list(session.scalars(named)),
        "named by deployments",
        "remove it from their placement.allowed_regions and traffic first",
    )


# GPU types ---------------------------------------------------------------------------------


def _load_gpu_type(row: m.GpuType) -> dict[str, Any]:
    return {"name": row.name, "memory_gib": row.memory_gib}


def _apply_gpu_type(session: Session, row: m.GpuType, spec: GpuTypeSpec) -> None:
    row.name, row.memory_gib = spec.name, spec.memory_gib


def _check_delete_gpu_type(session: Session, row: m.GpuType, force: bool) -> None:
    pools = list(session.scalars(select(m.Pool).where(m.Pool.gpu_type_id == row.id)))
    _refuse_if(pools, "used by pools", "delete those pools first")
    users = list(
        session.scalars(select(m.Deployment).where(m.Deployment.gpu_types.contains([row.name])))
    )
    _refuse_if(users, "accepted by deployments", "remove it from their gpu_types first")


# pools -------------------------------------------------------------------------------------

_POOL_OPTIONAL = (
    "instance_type",
    "term_start",
    "term_end",
    "committed_gpus",
    "capacity_reservation_id",
    "quota_gpus",
    "interruptions_per_hour",
    "notice_seconds",
)


def _load_pool(row: m.Pool) -> dict[str, Any]:
    spec = {
        "name": row.name,
        "provider": row.provider.name,
        "region": row.region.name,
        "gpu_type": row.gpu_type.name,
        "purchase_type": row.purchase_type,
        "gpus": row.gpus,
        "gpus_per_instance": row.gpus_per_instance,
        "price_per_gpu_hour": row.price_per_gpu_hour,
    }
    spec.update({k: getattr(row, k) for k in _POOL_OPTIONAL if getattr(row, k) is not None})
    return spec


def _apply_pool(session: Session, row: m.Pool, spec: PoolSpec) -> None:
    provider = _referenced(session, row.provider, m.Provider, spec.provider, "provider")
    region = _referenced(session, row.region, m.Region, spec.region, "region")
    if region.provider_id != provider.id:
        raise InvalidSpec.on(
            "region",
            f"region '{region.name}' belongs to provider '{region.provider.name}', not "
            f"'{provider.name}'; pick a region of '{provider.name}'",
        )
    gpu_type = (
        _loaded(row.gpu_type, spec.gpu_type)
        or session.scalars(select(m.GpuType).where(m.GpuType.name == spec.gpu_type)).first()
    )
    if gpu_type is None:
        known = ", ".join(session.scalars(select(m.GpuType.name).order_by(m.GpuType.name)))
        raise InvalidSpec.on(
            "gpu_type", f"unknown GPU type '{spec.gpu_type}'; known: {known or 'none yet'}"
        )
    _refuse_moving_held(session, row, provider, region, gpu_type, spec)
    row.name, row.provider, row.region, row.gpu_type = spec.name, provider, region, gpu_type
    row.purchase_type = spec.purchase_type.value
    row.gpus, row.gpus_per_instance = spec.gpus, spec.gpus_per_instance
    row.price_per_gpu_hour = spec.price_per_gpu_hour
    for key in _POOL_OPTIONAL:
        setattr(row, key, getattr(spec, key))


def _held(session: Session, pool_ids: Select[Any] | list[str]) -> int:
    """Instances that exist (or may) at the provider in these pools."""
    query = select(func.count()).select_from(m.Instance)
    return (
        session.scalar(query.where(m.Instance.pool_id.in_(pool_ids), m.Instance.state.in_(HELD)))
        or 0
    )


def _refuse_moving_held(
    session: Session,
    row: m.Pool,
    provider: m.Provider,
    region: m.Region,
    gpu_type: m.GpuType,
    spec: PoolSpec,
) -> None:
    """What its instances are (the provider and account holding them, where, what) may not
    change under them: the sweeps would ask the new provider for them, mark them gone and
    buy replacements, and a release would send their ids to the wrong account."""
    if row.id is None:
        return
    changed = [
        name
        for name, before, after in (
            ("provider", row.provider_id, provider.id),
            ("region", row.region_id, region.id),
            ("gpu_type", row.gpu_type_id, gpu_type.id),
            ("purchase_type", row.purchase_type, spec.purchase_type.value),
            ("gpus_per_instance", row.gpus_per_instance, spec.gpus_per_instance),
            ("capacity_reservation_id", row.capacity_reservation_id, spec.capacity_reservation_id),
        )
        if before != after
    ]
    if changed and (held := _held(session, [row.id])):
        raise InUse(
            f"holds {held} instance(s): its {', '.join(changed)} cannot change under them; "
            "release them first (scale its deployments down or remove the pool from its "
            "clusters), or create a new pool"
        )


def _check_delete_pool(session: Session, row: m.Pool, force: bool) -> None:
    held = _held(session, [row.id])
    if held:
        raise InUse(
            f"still holds {held} instance(s); release them first (scale its deployments "
            "down or remove the pool from its clusters and wait for release)"
        )
    clusters = list(
        session.scalars(
            select(m.Cluster).join(m.cluster_pools).where(m.cluster_pools.c.pool_id == row.id)
        )
    )
    _refuse_if(clusters, "drawn on by clusters", "remove it from their pools first")
    # what it held and gave back (or never got: a refusal) goes with it: events keep the story
    session.execute(delete(m.Instance).where(m.Instance.pool_id == row.id))


# clusters ----------------------------------------------------------------------------------


def _load_cluster(row: m.Cluster) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": row.name,
        "region": row.region.name,
        "pools": sorted(p.name for p in row.pools),
        "cordoned": row.state == "cordoned" or cluster_status(row).cordoned,
    }
    if row.endpoint:
        spec["endpoint"] = row.endpoint
    return spec


def _apply_cluster(session: Session, row: m.Cluster, spec: ClusterSpec) -> None:
    region = _referenced(session, row.region, m.Region, spec.region, "region")
    held = {p.name: p for p in row.pools}
    pools = [_referenced(session, held.get(name), m.Pool, name, "pools") for name in spec.pools]
    row.name, row.region, row.pools = spec.name, region, pools
    row.endpoint = str(spec.endpoint) if spec.endpoint else None
    set_status(row, cordoned=spec.cordoned)


def _check_delete_cluster(session: Session, row: m.Cluster, force: bool) -> None:
    _refuse_if(
        _standby_of(session, row),
        "the failover.standby_cluster of",
        "give them another standby cluster (or mode: active_active) first",
    )
    replicas = list(session.scalars(select(m.Replica).where(m.Replica.cluster_id == row.id)))
    if replicas and not force:
        raise InUse(
            f"still runs {len(replicas)} replica(s); drain it first (cordoned: true) or "
            "delete with ?force=true"
        )


# deployments -------------------------------------------------------------------------------


def _load_deployment(row: m.Deployment) -> dict[str, Any]:
    return {
        "name": row.name,
        "model_id": row.model_id,
        "model_revision": row.model_revision,
        "engine_image": row.engine_image,
        "engine_args": row.engine_args,
        "gpus_per_replica": row.gpus_per_replica,
        "gpu_types": row.gpu_types,
        "autoscaling": row.autoscaling,
        "placement": row.placement,
        "priority": row.priority,
        "traffic": row.traffic,
        "failover": deployment_failover(row).model_dump(mode="json"),
        "rollout": row.rollout or {},
        "shadow": row.shadow,
    }


def _apply_deployment(session: Session, row: m.Deployment, spec: DeploymentSpec) -> None:
    known = set(session.scalars(select(m.GpuType.name)))
    for i, name in enumerate(spec.gpu_types):
        if name not in known:
            raise InvalidSpec.on(
                f"gpu_types[{i}]",
                f"unknown GPU type '{name}'; known: {', '.join(sorted(known)) or 'none yet'}",
            )
    regions = set(session.scalars(select(m.Region.name)))
    for i, name in enumerate(spec.placement.allowed_regions):
        if name not in regions:
            raise InvalidSpec.on(f"placement.allowed_regions[{i}]", f"no region named '{name}'")
    for name in spec.traffic:
        if name not in regions:
            raise InvalidSpec.on(f"traffic.{name}", f"no region named '{name}'")
    if (standby := spec.failover.standby) is not None:
        _check_standby(session, spec, standby)
    for key, value in spec.model_dump(mode="json").items():
        setattr(row, key, value)


def _check_standby(session: Session, spec: DeploymentSpec, standby: str) -> None:
    """The standby cluster exists and may carry the deployment (its residency and
    certifications), so that failing over never crosses a border the deployment forbids."""
    where = "failover.standby_cluster"
    cluster = _by_name(session, m.Cluster, standby, where)
    region, rules = cluster.region, spec.placement
    if rules.allowed_jurisdictions and region.jurisdiction not in rules.allowed_jurisdictions:
        raise InvalidSpec.on(
            where,
            f"cluster '{cluster.name}' is in {region.jurisdiction}, outside "
            f"placement.allowed_jurisdictions ({', '.join(rules.allowed_jurisdictions)}); "
            "pick a standby cluster there or widen the residency",
        )
    if rules.allowed_regions and region.name not in rules.allowed_regions:
        raise InvalidSpec.on(
            where,
            f"cluster '{cluster.name}' is in region '{region.name}', not in "
            "placement.allowed_regions; pick a standby cluster there or add its region",
        )
    missing = sorted(set(rules.required_certifications) - set(region.provider.certifications))
    if missing:
        raise InvalidSpec.on(
            where,
            f"cluster '{cluster.name}' runs on provider '{region.provider.name}', which lacks "
            f"{', '.join(missing)} (placement.required_certifications); pick another cluster",
        )


def _standby_of(session: Session, cluster: m.Cluster) -> list[m.Deployment]:
    """Deployments whose active_passive standby is ``cluster``."""
    rows = session.scalars(
        select(m.Deployment).where(
            m.Deployment.failover["standby_cluster"].astext == cluster.name,
            m.Deployment.failover["mode"].astext == "active_passive",
        )
    )
    return list(rows)


def _check_delete_deployment(session: Session, row: m.Deployment, force: bool) -> None:
    count = session.scalar(
        select(func.count()).select_from(m.Replica).where(m.Replica.deployment_id == row.id)
    )
    if count and not force:
        raise InUse(
            f"still has {count} replica(s); scale it to zero first or delete with ?force=true"
        )
    if force:
        session.query(m.Replica).filter(m.Replica.deployment_id == row.id).delete()


# tokens ------------------------------------------------------------------------------------


def _load_token(row: m.ApiToken) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": row.name, "role": row.role}
    if row.description is not None:
        spec["description"] = row.description
    if row.expires_at is not None:
        spec["expires_at"] = row.expires_at
    return spec


def _apply_token(session: Session, row: m.ApiToken, spec: TokenSpec) -> None:
    if row.role == Role.admin and spec.role != Role.admin:
        keep_one_admin(session, row, "demote")
    elif (
        row.role == Role.admin
        and spec.expires_at is not None
        and spec.expires_at != row.expires_at
        and spec.expires_at <= datetime.now(UTC)
    ):
        keep_one_admin(session, row, "expire")
    row.name, row.role = spec.name, spec.role.value
    row.description, row.expires_at = spec.description, spec.expires_at


def keep_one_admin(session: Session, row: m.ApiToken, verb: str) -> None:
    """Another admin token that works (enabled, not expired) stays, or ``InUse``. The admin
    rows are locked first: two admins disabling each other's tokens at once could both
    pass a check that counted the other."""
    session.scalars(
        select(m.ApiToken.id).where(m.ApiToken.role == Role.admin).with_for_update()
    ).all()
    now = datetime.now(UTC)
    others = session.scalar(
        select(func.count())
        .select_from(m.ApiToken)
        .where(
            m.ApiToken.role == Role.admin,
            m.ApiToken.id != row.id,
            ~m.ApiToken.disabled,
            (m.ApiToken.expires_at.is_(None)) | (m.ApiToken.expires_at > now),
        )
    )
    if not others:
        raise InUse(f"cannot {verb} the last admin token; create another admin token first")


def _check_delete_token(session: Session, row: m.ApiToken, force: bool) -> None:
    if row.role == Role.admin:
        keep_one_admin(session, row, "delete")


# API prices --------------------------------------------------------------------------------


def _load_api_price(row: m.ApiPrice) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": row.name,
        "model_id": row.model_id,
        "input_price_per_mtok": row.input_price_per_mtok,
        "output_price_per_mtok": row.output_price_per_mtok,
    }
    if row.source is not None:
        spec["source"] = row.source
    return spec


def _apply_api_price(session: Session, row: m.ApiPrice, spec: ApiPriceSpec) -> None:
    row.name, row.model_id, row.source = spec.name, spec.model_id, spec.source
    row.input_price_per_mtok = spec.input_price_per_mtok
    row.output_price_per_mtok = spec.output_price_per_mtok


def _nothing_uses(session: Session, row: Any, force: bool) -> None:
    """Nothing refers to it: it may always be deleted."""


KINDS: dict[str, ResourceKind] = {
    k.path: k
    for k in (
        ResourceKind(
            "Provider", "providers", m.Provider, ProviderSpec, Role.admin,
            _load_provider, _apply_provider, _check_delete_provider,
            {
                "provider_kind": eq_filter(m.Provider.kind),
                "provider_class": eq_filter(m.Provider.provider_class),
                "certification": _contains(m.Provider.certifications),
            },
            core_writes=True,
        ),
        ResourceKind(
            "Region", "regions", m.Region, RegionSpec, Role.admin,
            _load_region, _apply_region, _check_delete_region,
            {"provider": ref_filter(m.Region.provider_id, m.Provider), "jurisdiction": eq_filter(m.Region.jurisdiction)},
            core_writes=True,
        ),
        ResourceKind(
            "GpuType", "gpu-types", m.GpuType, GpuTypeSpec, Role.admin,
            _load_gpu_type, _apply_gpu_type, _check_delete_gpu_type, core_writes=True,
        ),
        ResourceKind(
            "Pool", "pools", m.Pool, PoolSpec, Role.operator,
            _load_pool, _apply_pool, _check_delete_pool,
            {
                "provider": ref_filter(m.Pool.provider_id, m.Provider),
                "region": ref_filter(m.Pool.region_id, m.Region),
                "gpu_type": ref_filter(m.Pool.gpu_type_id, m.GpuType),
                "purchase_type": eq_filter(m.Pool.purchase_type),
            },
            removing=removing_pool, core_writes=True,
        ),
        ResourceKind(
            "Cluster", "clusters", m.Cluster, ClusterSpec, Role.operator,
            _load_cluster, _apply_cluster, _check_delete_cluster,
            {"region": ref_filter(m.Cluster.region_id, m.Region), "state": eq_filter(m.Cluster.state)},
            removing=removing_cluster,
        ),
        ResourceKind(
            "Deployment", "deployments", m.Deployment, DeploymentSpec, Role.operator,
            _load_deployment, _apply_deployment, _check_delete_deployment,
            {"model_id": eq_filter(m.Deployment.model_id), "gpu_type": _contains(m.Deployment.gpu_types)},
            removing=removing_deployment,
        ),
        ResourceKind(
            "Token", "tokens", m.ApiToken, TokenSpec, Role.admin,
            _load_token, _apply_token, _check_delete_token,
            {"role": eq_filter(m.ApiToken.role)}, read_role=Role.admin, core_writes=True,
        ),
        ResourceKind(
            "ApiPrice", "api-prices", m.ApiPrice, ApiPriceSpec, Role.operator,
            _load_api_price, _apply_api_price, _nothing_uses,
            {"model_id": eq_filter(m.ApiPrice.model_id)}, core_writes=True,
        ),
    )
}  # fmt: skip

KIND_BY_NAME: dict[str, ResourceKind] = {k.kind.lower(): k for k in KINDS.values()}
