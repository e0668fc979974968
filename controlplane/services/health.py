"""Readiness of the control plane's own dependencies, for /readyz."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


def database_answers(session: Session) -> None:
    """One round trip; raises whatever the driver raises when the database is unreachable."""
    session.execute(text("SELECT 1"))
