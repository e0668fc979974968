"""Dashboard sessions (`controlplane.dashboard.session` hands them out as cookies): a random
id per sign-in, only its SHA-256 stored, with the token it speaks for and its expiry.
Closing one (logout) deletes its row; a token disabled, expired or deleted ends its
sessions."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db.base import utcnow
from controlplane.db.models import ApiToken, DashboardSession
from controlplane.services.inventory import hash_token
from controlplane.services.tokens import ValidToken
from controlplane.specs import Role

SESSION_LIFETIME = timedelta(hours=12)
"""How long a dashboard sign-in lasts (then the token is asked for again)."""
MAX_SESSION_ID = 64
"""A cookie longer than any id we hand out is no session (and is not hashed)."""
MAX_PER_TOKEN = 50
"""Sessions one token keeps (its oldest end as new ones open): a token signing in in a loop
does not grow the table."""


class SessionStore:
    """Dashboard sessions in PostgreSQL, with a short per-process cache (as the token
    verifier's): which token a session speaks for is read at most every ``ttl_s``."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        ttl_s: float = 5.0,
        lifetime: timedelta = SESSION_LIFETIME,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._factory, self._ttl_s, self._lifetime, self._clock = factory, ttl_s, lifetime, clock
        self._cache: dict[str, tuple[float, ValidToken]] = {}

    def open(self, token_id: str, replacing: str | None = None) -> str | None:
        """A new session for the token; its id (the cookie's value), or None when the token
        is gone (deleted since it was verified). ``replacing``: the session the browser
        held before, ended. Expired sessions are dropped on the way, and a token keeps its
        ``MAX_PER_TOKEN`` newest sessions."""
        session_id = secrets.token_urlsafe(32)
        now = self._clock()
        with self._factory() as db, db.begin():
            if db.get(ApiToken, token_id, with_for_update={"key_share": True}) is None:
                return None
            db.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
            if replacing and len(replacing) <= MAX_SESSION_ID:
                self._cache.pop(hash_token(replacing), None)
                db.execute(delete(DashboardSession).where(
                    DashboardSession.id_hash == hash_token(replacing)))  # fmt: skip
            kept = (
                select(DashboardSession.id_hash)
                .where(DashboardSession.token_id == token_id)
                .order_by(DashboardSession.created_at.desc())
                .limit(MAX_PER_TOKEN - 1)
            )
            db.execute(delete(DashboardSession).where(
                DashboardSession.token_id == token_id, DashboardSession.id_hash.not_in(kept)))  # fmt: skip
            db.add(DashboardSession(id_hash=hash_token(session_id), token_id=token_id,
                                    created_at=now, expires_at=now + self._lifetime))  # fmt: skip
        return session_id

    def forget(self) -> None:
        """Drop the cache (a token was disabled or deleted here: its sessions end at once)."""
        self._cache.clear()

    def token(self, session_id: str) -> ValidToken | None:
        """The token the session speaks for; None once the session ended or expired, or its
        token is no longer valid (disabled, expired, deleted)."""
        if len(session_id) > MAX_SESSION_ID:
            return None
        digest = hash_token(session_id)
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        self._cache.pop(digest, None)
        now = self._clock()
        with self._factory() as db:
            row = db.execute(
                select(DashboardSession.expires_at, ApiToken)
                .join(ApiToken, ApiToken.id == DashboardSession.token_id)
                .where(DashboardSession.id_hash == digest)
            ).first()
        if row is None:
            return None
        expires_at, token = row
        if expires_at <= now or token.disabled or (token.expires_at and token.expires_at <= now):
            return None
        valid = ValidToken(token.id, token.name, Role(token.role))
        if len(self._cache) >= 10_000:
            self._cache.clear()
        self._cache[digest] = (time.monotonic() + self._ttl_s, valid)
        return valid

    def close(self, session_id: str) -> None:
        """End the session (logout): its cookie, and every copy of it, no longer signs in."""
        digest = hash_token(session_id)
        self._cache.pop(digest, None)
        with self._factory() as db, db.begin():
            db.execute(delete(DashboardSession).where(DashboardSession.id_hash == digest))
