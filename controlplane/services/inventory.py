"""Create, read, list, replace, patch and delete any user-managed kind, with audit.

Callers own the transaction. Writes compare the normalised spec before and after: only a real
change bumps `generation` and writes an audit entry. `expected_generation` (If-Match) guards
against lost updates.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from pydantic import ValidationError
from pydantic_core import to_jsonable_python
from sqlalchemy import Connection, Select, bindparam, select
from sqlalchemy.orm import Session

from controlplane import spec_values
from controlplane.credentials import generate_cluster_credentials, hash_password
from controlplane.db import models as m
from controlplane.errors import BadRequest, Conflict, InvalidSpec, NotFound, StaleGeneration
from controlplane.services import audit, rollouts, rowviews, shadows
from controlplane.services.desired import (
    bump_desired,
    clusters_serving,
    pool_is_empty,
    withdraw_placements,
)
from controlplane.services.resources import ResourceKind
from controlplane.services.validation import invalid_spec_from
from controlplane.specs import REVISION_FIELDS, Spec

TOKEN_PREFIX = "gpf_"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    name: str
    request_id: str | None = None


@dataclass
class WriteResult:
    row: Any
    created: bool = False
    changed: bool = False
    secrets: dict[str, Any] | None = None
    """Shown once in the create response (a token, a cluster's NATS credentials)."""
    spec: dict[str, Any] | None = None
    """The row's spec as JSON after the write (`spec_json`), rendered once by the write."""


def parse_spec(kind: ResourceKind, body: Mapping[str, Any]) -> Spec:
    try:
        return kind.spec.model_validate(dict(body))
    except ValidationError as exc:
        raise invalid_spec_from(exc, kind.kind) from exc


def spec_json(kind: ResourceKind, row: Any) -> dict[str, Any]:
    stored = kind.load(row)
    try:
        return kind.spec.model_validate(stored).model_dump(mode="json", exclude_none=True)
    except ValidationError:
        # stored before today's limits (specs.py): still readable and deletable; a PATCH or
        # PUT must bring it within them (its 422 names the field)
        log.warning("%s '%s' exceeds the spec's limits; shown as stored", kind.kind, row.name)
        return {k: v for k, v in to_jsonable_python(stored).items() if v is not None}


def to_json(kind: ResourceKind, row: Any, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The API's representation; `spec` is `spec_json(kind, row)` when the caller has it."""
    body: dict[str, Any] = {"kind": kind.kind, "id": row.id}
    body.update(spec_json(kind, row) if spec is None else spec)
    body["generation"] = row.generation
    body["created_at"] = row.created_at.isoformat()
    body["updated_at"] = row.updated_at.isoformat()
    body["status"] = status_of(kind, row)
    return body


def status_of(kind: ResourceKind, row: Any) -> dict[str, Any]:
    """`row` is the ORM object or a `rowviews.RowView` of it: the kind says which fields."""
    status = dict(row.status or {})
    if kind.row is m.Cluster:
        status.update(
            state=row.state,
            agent_version=row.agent_version,
            last_heartbeat_at=row.last_heartbeat_at.isoformat() if row.last_heartbeat_at else None,
            desired_generation=row.desired_generation,
            observed_generation=row.observed_generation,
        )
    elif kind.row is m.Deployment:
        status.update(revision=row.revision, demand_replicas=row.demand_replicas)
    elif kind.row is m.ApiToken:
        status.update(
            prefix=row.prefix,
            last_used_at=row.last_used_at.isoformat() if row.last_used_at else None,
        )
    return status


class Rendered:
    """Representations rendered once per row version in this process: reading one object costs
    one indexed query for its `updated_at` (every ORM and Core update stamps it), and the row is
    loaded and rendered again only when that moved. Bounded: the least recently read go first.

    The query is a Core statement built once per kind, run on a plain connection: no ORM
    session on the hot path (one per read cost more CPU than the query itself)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._bodies: OrderedDict[tuple[str, str], tuple[datetime, int, dict[str, Any]]] = (
            OrderedDict()
        )
        self._stamps: dict[tuple[str, bool], Select[Any, Any]] = {}

    def get_json(
        self, connection: Connection, kind: ResourceKind, ref: str
    ) -> tuple[dict[str, Any], int]:
        """The object's representation (a copy: callers may add to it) and its generation."""
        stamp = connection.execute(self._stamp_of(kind, _is_uuid(ref)), {"ref": ref}).first()
        if stamp is None:
            raise _not_found(kind, ref)
        key = (kind.kind, stamp.id)
        hit = self._bodies.get(key)
        if hit is not None and hit[0] == stamp.updated_at:
            self._bodies.move_to_end(key)
            return dict(hit[2]), hit[1]
        with Session(connection) as session:
            row = get(session, kind, ref)
            body = to_json(kind, row)
        self._bodies[key] = (row.updated_at, row.generation, body)
        self._bodies.move_to_end(key)
        while len(self._bodies) > self.capacity:
            self._bodies.popitem(last=False)
        return dict(body), row.generation

    def _stamp_of(self, kind: ResourceKind, by_id: bool) -> Select[Any, Any]:
        """`SELECT id, updated_at … WHERE id|name = :ref`, built (and its cache key) once."""
        stmt = self._stamps.get((kind.kind, by_id))
        if stmt is None:
            column = kind.row.id if by_id else kind.row.name
            stmt = select(kind.row.id, kind.row.updated_at).where(column == bindparam("ref"))
            self._stamps[(kind.kind, by_id)] = stmt
        return stmt


def _not_found(kind: ResourceKind, ref: str) -> NotFound:
    return NotFound(f"{kind.kind} '{ref}' does not exist; list them with GET /api/v1/{kind.path}")


def get(session: Session, kind: ResourceKind, ref: str, *, for_update: bool = False) -> Any:
    """The row named or identified by ``ref``. ``for_update``: lock it until the transaction
    ends, so that two writes of one object run one after the other and the second sees the
    first's generation (an If-Match of both would otherwise pass and one change be lost)."""
    column = kind.row.id if _is_uuid(ref) else kind.row.name
    stmt = select(kind.row).where(column == ref)
    if for_update:
        stmt = stmt.with_for_update(of=kind.row)
    row = session.scalars(stmt).first()
    if row is None:
        raise _not_found(kind, ref)
    return row


def _locked(session: Session, kind: ResourceKind, ref: str, by_id: bool) -> Any:
    """The row to write, locked as `get(…, for_update=True)` locks it, or None: for a kind
    with `core_writes` a `rowviews.RowView` read by one Core statement, else the ORM object."""
    if kind.core_writes:
        return rowviews.locked(session, kind.row, ref, by_id)
    column = kind.row.id if by_id else kind.row.name
    stmt = select(kind.row).where(column == ref).with_for_update(of=kind.row)
    return session.scalars(stmt).first()


def list_rows(
    session: Session,
    kind: ResourceKind,
    filters: Mapping[str, str],
    limit: int,
    cursor: str | None,
) -> tuple[list[Any], str | None]:
    stmt = select(kind.row).order_by(kind.row.name)
    for key, value in filters.items():
        apply_filter = kind.filters.get(key)
        if apply_filter is None:
            allowed = ", ".join(sorted(kind.filters)) or "none"
            raise BadRequest(f"unknown filter '{key}' for {kind.path}; allowed filters: {allowed}")
        stmt = apply_filter(stmt, value)
    if cursor:
        stmt = stmt.where(kind.row.name > _decode_cursor(cursor))
    rows = list(session.scalars(stmt.limit(limit + 1)).unique())
    next_cursor = _encode_cursor(rows[limit - 1].name) if len(rows) > limit else None
    return rows[:limit], next_cursor


def create(session: Session, kind: ResourceKind, spec: Spec, actor: Actor) -> WriteResult:
    name = getattr(spec, "name")  # noqa: B009 - every spec has a name
    if session.scalars(select(kind.row.id).where(kind.row.name == name)).first():
        raise Conflict(
            f"{kind.kind} '{name}' already exists; use PUT /api/v1/{kind.path}/{name} to "
            "replace it or PATCH to change it"
        )
    row = kind.row()
    row.generation = 1
    kind.apply(session, row, spec)
    secrets = _on_create(session, row)
    session.add(row)
    session.flush()
    after = spec_json(kind, row)
    _audit(session, actor, "create", kind, row, before=None, after=after)
    return WriteResult(row, created=True, changed=True, secrets=secrets, spec=after)


def replace(
    session: Session,
    kind: ResourceKind,
    name: str,
    spec: Spec,
    actor: Actor,
    expected_generation: int | None = None,
    must_exist: bool = False,
) -> WriteResult:
    """Create or replace ``name``; ``must_exist`` (``If-Match: *``): replace only, decided
    on the locked row (a DELETE committed meanwhile is seen, never undone by a create)."""
    if getattr(spec, "name") != name:  # noqa: B009
        raise InvalidSpec.on("name", f"must equal the name in the URL ('{name}')")
    row = _locked(session, kind, name, by_id=False)
    if row is None:
        if must_exist:
            raise StaleGeneration(
                f"{kind.kind} '{name}' does not exist and If-Match: * asks for an existing "
                "one; drop If-Match to create it"
            )
        if expected_generation is not None:
            raise StaleGeneration(
                f"{kind.kind} '{name}' does not exist; drop If-Match to create it"
            )
        return create(session, kind, spec, actor)
    return _update(session, kind, row, spec, actor, expected_generation)


def patch(
    session: Session,
    kind: ResourceKind,
    ref: str,
    changes: Mapping[str, Any],
    actor: Actor,
    expected_generation: int | None = None,
) -> WriteResult:
    row = _locked(session, kind, ref, _is_uuid(ref))
    if row is None:
        raise _not_found(kind, ref)
    _check_generation(kind, row, expected_generation)
    before = spec_json(kind, row)
    merged = merge_patch(before, changes)
    return _update(session, kind, row, parse_spec(kind, merged), actor, None, before)


def delete(
    session: Session,
    kind: ResourceKind,
    ref: str,
    actor: Actor,
    force: bool = False,
    expected_generation: int | None = None,
) -> None:
    row = get(session, kind, ref, for_update=True)
    _check_generation(kind, row, expected_generation)
    affected = kind.removing(session, row)  # before its placements and replicas go
    kind.check_delete(session, row, force)
    before = spec_json(kind, row)
    _audit(session, actor, "delete", kind, row, before=before, after=None)
    session.delete(row)
    session.flush()
    bump_desired(session, affected)


def _audit(
    session: Session,
    actor: Actor,
    action: str,
    kind: ResourceKind,
    row: Any,
    *,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    audit.record(
        session,
        actor=actor.name,
        action=action,
        kind=kind.kind,
        resource_id=row.id,
        name=row.name,
        before=before,
        after=after,
        request_id=actor.request_id,
    )


def merge_patch(target: Any, patch_doc: Any) -> Any:
    """RFC 7396 JSON merge patch: objects merge, null removes, anything else replaces."""
    if not isinstance(patch_doc, Mapping):
        return patch_doc
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch_doc.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _update(
    session: Session,
    kind: ResourceKind,
    row: Any,
    spec: Spec,
    actor: Actor,
    expected_generation: int | None,
    before: dict[str, Any] | None = None,
) -> WriteResult:
    """`before` is `spec_json(kind, row)` when the caller has it. A change costs the row's
    UPDATE and the audit INSERT (plus what `_on_change` needs): the representation after it
    is the spec (load and apply are inverse, resources.py), not rendered from the row again.
    `row` is the ORM object, or for a kind with `core_writes` a `rowviews.RowView` whose
    UPDATE is sent here (Core), where the ORM object's is the session's flush."""
    _check_generation(kind, row, expected_generation)
    if before is None:
        before = spec_json(kind, row)
    if getattr(spec, "name") != row.name:  # noqa: B009
        raise InvalidSpec.on("name", "cannot be changed; create a new object and delete this one")
    after = spec.model_dump(mode="json", exclude_none=True)
    if before == after:
        return WriteResult(row, spec=before)
    kind.apply(session, row, spec)
    row.generation += 1
    if isinstance(row, rowviews.RowView):
        rowviews.write(row)
    _on_change(session, kind, row, before, after)
    session.flush()
    _audit(session, actor, "update", kind, row, before=before, after=after)
    return WriteResult(row, changed=True, spec=after)


def _check_generation(kind: ResourceKind, row: Any, expected: int | None) -> None:
    if expected is not None and expected != row.generation:
        raise StaleGeneration(
            f"{kind.kind} '{row.name}' is at generation {row.generation}, not {expected}; "
            "GET it again, re-apply your change and retry with the new If-Match"
        )


def _on_create(session: Session, row: Any) -> dict[str, Any] | None:
    """Kind-specific first-write work; returns secrets to show exactly once, if any."""
    if isinstance(row, m.Deployment):
        row.revision = 1
        row.revisions.append(m.DeploymentRevision(revision=1, spec=revision_spec(row)))
    if isinstance(row, m.ApiToken):
        secret, row.token_hash, row.prefix = new_token()
        return {"token": secret}
    if isinstance(row, m.Cluster):
        # generation 1, empty: published like any snapshot, so a key an earlier cluster of
        # this name left behind (deleted and made again between two ticks of the bus, or
        # while it was down) is overwritten — in a new epoch — instead of run by the new
        # cluster's agent on GPUs placement takes for free
        row.desired_generation = 1
        creds = generate_cluster_credentials(row.name)
        row.nats_user, row.nats_password_hash = creds.user, hash_password(creds.password)
        return {"nats_credentials": creds.model_dump()}
    return None


def _on_change(
    session: Session, kind: ResourceKind, row: Any, before: dict[str, Any], after: dict[str, Any]
) -> None:
    """`row` is the ORM object, or a `rowviews.RowView` for a kind with `core_writes`."""
    if isinstance(row, m.Deployment) and any(
        before.get(f) != after.get(f) for f in REVISION_FIELDS
    ):
        previous, row.revision = row.revision, rollouts.next_revision(session, row)
        session.add(  # not row.revisions.append: that loads every stored revision first
            m.DeploymentRevision(
                deployment_id=row.id, revision=row.revision, spec=revision_spec(row)
            )
        )
        rollouts.on_revision_change(session, row, previous, datetime.now(UTC))
    if isinstance(row, m.Deployment):  # its snapshot entry changed where it is served
        shadows.note_change(session, row, before, after)
        bump_desired(session, clusters_serving(session, [row.id]))
    # a removal inside an update reaches the planes now, not at the next re-plan
    if isinstance(row, m.Cluster):
        left = set(before.get("pools", ())) - set(after.get("pools", ()))
        if left:
            pool_ids = session.scalars(select(m.Pool.id).where(m.Pool.name.in_(sorted(left))))
            withdraw_placements(session, row.id, pool_ids)
    if kind.row is m.Pool and pool_is_empty(session, cast(m.Pool, row)):  # or its RowView
        withdraw_placements(session, pool_ids=[row.id])


def revision_spec(row: m.Deployment) -> dict[str, Any]:
    return {f: getattr(row, f) for f in REVISION_FIELDS}


def new_token() -> tuple[str, str, str]:
    """(secret, sha256 hex, display prefix). 32 random bytes: a fast hash is enough."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return secret, hash_token(secret), secret[: len(TOKEN_PREFIX) + 6]


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _is_uuid(value: str) -> bool:
    """A reference is an id only in the canonical form (names cannot take it); any other
    form ``uuid.UUID`` reads (32 hex digits, dashes anywhere) is a name."""
    return spec_values.is_canonical_uuid(value)


def _encode_cursor(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    try:
        name = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest("cursor is not valid; pass next_cursor from the previous page") from exc
    if len(name) > 128 or not name.isprintable():  # a NUL reached PostgreSQL: a 500
        raise BadRequest("cursor is not valid; pass next_cursor from the previous page")
    return name
