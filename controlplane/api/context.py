"""Per-request plumbing shared by routers: the session, the actor, If-Match, filters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from controlplane.contracts import whole_number
from controlplane.errors import BadRequest
from controlplane.services.inventory import Actor

RESERVED_QUERY = frozenset({"limit", "cursor", "force"})


@contextmanager
def session_scope(request: Request) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, rolled back on error."""
    with request.app.state.session_factory() as session, session.begin():
        yield session


@contextmanager
def read_scope(request: Request) -> Iterator[Session]:
    """A read-only session in autocommit mode: one round trip per query, nothing to commit."""
    with request.app.state.read_session_factory() as session:
        yield session


@contextmanager
def read_connection(request: Request) -> Iterator[Connection]:
    """A Core connection in autocommit mode, for reads that need no ORM session."""
    with request.app.state.read_engine.connect() as connection:
        yield connection


def actor_of(request: Request) -> Actor:
    principal = getattr(request.state, "principal", None)
    return Actor(
        name=principal.actor if principal else "system",
        request_id=getattr(request.state, "request_id", None),
    )


ANY = "*"


def if_match_any(request: Request) -> bool:
    """`If-Match: *`: any current representation matches (RFC 9110 §13.1.1)."""
    return (request.headers.get("if-match") or "").strip() == ANY


def if_match(request: Request) -> int | None:
    """The generation If-Match names; None without one, or for `*` (any generation)."""
    raw = request.headers.get("if-match")
    if raw is None or raw.strip() == ANY:
        return None
    value = raw.strip().removeprefix("W/").strip('"')
    generation = whole_number(value)
    if generation is None:
        raise BadRequest(
            f'If-Match must be the object\'s generation (e.g. If-Match: "3") or *, got {raw!r}'
        )
    return generation


def list_filters(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items() if k not in RESERVED_QUERY}
