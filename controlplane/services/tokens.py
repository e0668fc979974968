"""API tokens: the first admin token (created once on an empty database, shown once) and
the check of a presented token. Only SHA-256 hashes of tokens are stored."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from controlplane.db.models import ApiToken, DashboardSession
from controlplane.errors import Unauthenticated
from controlplane.services import inventory
from controlplane.services.audit import record
from controlplane.services.resources import KINDS, keep_one_admin
from controlplane.specs import Role, TokenSpec


@dataclass(frozen=True)
class ValidToken:
    id: str
    name: str
    role: Role


def valid_token(session: Session, digest: str, now: datetime) -> ValidToken:
    """The token whose SHA-256 is `digest`, or Unauthenticated (unknown, disabled, expired)."""
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
    if row is None or row.disabled:
        raise Unauthenticated("token is not valid; check it or ask an admin for a new one")
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthenticated(f"token '{row.name}' expired at {row.expires_at.isoformat()}")
    return ValidToken(row.id, row.name, Role(row.role))


def mark_used(session: Session, token_id: str, now: datetime) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))


def ensure_admin_token(session: Session, name: str = "admin") -> str | None:
    """Create an admin token when no token exists; returns its secret, else None."""
    if session.scalar(select(func.count()).select_from(ApiToken)):
        return None
    spec = TokenSpec(name=name, role=Role.admin, description="created at first start")
    result = inventory.create(session, KINDS["tokens"], spec, inventory.Actor("system:bootstrap"))
    return (result.secrets or {}).get("token")


def create_scrape_token(session: Session) -> str:
    """A viewer token for Prometheus to scrape ``/metrics`` with (`gpufleet up` keeps its
    secret beside the scrape configuration); a new name each time, the secret shown once."""
    spec = TokenSpec(
        name=f"prometheus-{secrets.token_hex(3)}",
        role=Role.viewer,
        description="Prometheus scrapes /metrics (written by gpufleet up)",
    )
    result = inventory.create(session, KINDS["tokens"], spec, inventory.Actor("system:up"))
    return (result.secrets or {})["token"]


def set_disabled(session: Session, ref: str, disabled: bool, actor: inventory.Actor) -> None:
    """Disable (or re-enable) a token, audited; the last enabled admin token stays enabled."""
    row = inventory.get(session, KINDS["tokens"], ref)
    if row.disabled == disabled:
        return
    if disabled and row.role == Role.admin:
        keep_one_admin(session, row, "disable")
    row.disabled = disabled
    if disabled:  # its dashboard sessions end for good, not only while it stays disabled
        session.execute(delete(DashboardSession).where(DashboardSession.token_id == row.id))
    record(
        session,
        actor=actor.name,
        action="disable" if disabled else "enable",
        kind="Token",
        resource_id=row.id,
        name=row.name,
        before={"disabled": not disabled},
        after={"disabled": disabled},
        request_id=actor.request_id,
    )
