"""The first admin token, created once on an empty database and shown once."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.db.models import ApiToken
from controlplane.services import inventory
from controlplane.services.resources import KINDS
from controlplane.specs import Role, TokenSpec


def ensure_admin_token(session: Session, name: str = "admin") -> str | None:
    """Create an admin token when no token exists; returns its secret, else None."""
    if session.scalar(select(func.count()).select_from(ApiToken)):
        return None
    spec = TokenSpec(name=name, role=Role.admin, description="created at first start")
    result = inventory.create(session, KINDS["tokens"], spec, inventory.Actor("system:bootstrap"))
    return (result.secrets or {}).get("token")
