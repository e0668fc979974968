"""Rows written with SQLAlchemy Core, for kinds whose writes need nothing of the ORM.

A write of such a kind (`ResourceKind.core_writes`) reads its row with one Core
`SELECT … FOR UPDATE` that joins the row's many-to-one references, hands a `RowView` of it to
the kind's own `load` and `apply` (they read and set attributes on it as on the ORM object),
and sends what `apply` changed as one Core `UPDATE`. The ORM round trip it replaces (loading
the object with its relations into a session, the unit of work's flush) cost a PATCH about
three times the CPU of these statements (docs/api.md, Performance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Column, Executable, Table, bindparam, inspect, select, update
from sqlalchemy.orm import Mapper, RelationshipDirection, Session
from sqlalchemy.orm.util import identity_key

from controlplane.db.base import utcnow


@dataclass(frozen=True)
class _Ref:
    key: str
    """The relationship's attribute (`provider`)."""
    foreign_key: str
    """The attribute of the local column pointing at the referenced row (`provider_id`)."""
    row_type: type[Any]
    keys: tuple[str, ...]
    """The referenced row's attributes, in the order selected."""


@dataclass(frozen=True)
class _Plan:
    table: Table
    keys: tuple[str, ...]
    columns: dict[str, str]
    """Attribute → column name of the row's own table."""
    refs: tuple[_Ref, ...]
    by_id: Executable
    by_name: Executable
    update: Executable


_PLANS: dict[type[Any], _Plan] = {}


def _plan(row_type: type[Any]) -> _Plan:
    """The statements for one mapped class, built (with their cache keys) once."""
    plan = _PLANS.get(row_type)
    if plan is not None:
        return plan
    mapper = cast(Mapper[Any], inspect(row_type))
    table = cast(Table, mapper.local_table)
    own = [(attr.key, cast(Column[Any], attr.columns[0])) for attr in mapper.column_attrs]
    selected: list[Any] = [column for _, column in own]
    joined: Any = table
    refs: list[_Ref] = []
    for rel in mapper.relationships:
        if rel.direction is not RelationshipDirection.MANYTOONE:
            continue  # collections are not loaded: a kind that needs one is written by the ORM
        [(local, remote)] = rel.local_remote_pairs
        target = rel.mapper
        alias = cast(Table, target.local_table).alias(f"ref_{rel.key}")
        target_attrs = [(a.key, a.columns[0].key) for a in target.column_attrs]
        joined = joined.join(
            alias, alias.c[cast(str, remote.key)] == local, isouter=bool(local.nullable)
        )
        selected += [alias.c[name] for _, name in target_attrs]
        refs.append(
            _Ref(
                rel.key,
                mapper.get_property_by_column(local).key,
                target.class_,
                tuple(key for key, _ in target_attrs),
            )
        )
    base = select(*selected).select_from(joined)
    plan = _Plan(
        table=table,
        keys=tuple(key for key, _ in own),
        columns={key: column.key for key, column in own},
        refs=tuple(refs),
        by_id=base.where(table.c.id == bindparam("ref")).with_for_update(of=table),
        by_name=base.where(table.c.name == bindparam("ref")).with_for_update(of=table),
        update=update(table).where(table.c.id == bindparam("_id")),
    )
    _PLANS[row_type] = plan
    return plan


class RowView:
    """A row read with Core, standing in for its ORM object in a kind's `load` and `apply`:
    its mapped attributes, and each many-to-one reference as a `RowView` of the referenced
    row's columns. Anything further (a reference of a reference, for an error message) is
    read through the session's ORM object on first use."""

    def __init__(self, row_type: type[Any], session: Session, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self._view_type = row_type
        self._view_session = session
        self._view_original = dict(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_view_"):
            raise AttributeError(name)
        row = self._view_session.get(self._view_type, self.__dict__["id"])
        return getattr(row, name)


def locked(session: Session, row_type: type[Any], ref: str, by_id: bool) -> RowView | None:
    """The row whose id (or name) is `ref`, locked until the transaction ends (`FOR UPDATE`,
    as the ORM path locks it), or None."""
    plan = _plan(row_type)
    statement = plan.by_id if by_id else plan.by_name
    got = session.connection().execute(statement, {"ref": ref}).first()
    if got is None:
        return None
    at = len(plan.keys)
    view = RowView(row_type, session, dict(zip(plan.keys, got[:at], strict=True)))
    for ref_ in plan.refs:
        values = dict(zip(ref_.keys, got[at : at + len(ref_.keys)], strict=True))
        at += len(ref_.keys)
        target = None if values.get("id") is None else RowView(ref_.row_type, session, values)
        view.__dict__[ref_.key] = target
        view._view_original[ref_.key] = target
    return view


def write(view: RowView) -> None:
    """One UPDATE of what changed since the row was read (`updated_at` stamped as the ORM's
    `onupdate` does); the session's ORM copy of the row, if it holds one, is expired."""
    plan = _plan(view._view_type)
    state, original = view.__dict__, view._view_original
    if "updated_at" in plan.columns:
        state["updated_at"] = utcnow()
    changes: dict[str, Any] = {}
    for ref in plan.refs:
        target = state[ref.key]
        if target is not original[ref.key]:  # a reference set by `apply` wins, as in a flush
            state[ref.foreign_key] = None if target is None else target.id
    for key in plan.keys:
        if state[key] != original[key]:
            changes[plan.columns[key]] = state[key]
    if not changes:
        return
    session = view._view_session
    session.connection().execute(plan.update, {"_id": original["id"], **changes})
    view._view_original = {**original, **{k: state[k] for k in plan.keys}}
    for ref in plan.refs:
        view._view_original[ref.key] = state[ref.key]
    cached = session.identity_map.get(identity_key(view._view_type, original["id"]))
    if cached is not None:
        session.expire(cached)
