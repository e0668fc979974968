"""Bearer-token authentication and role checks for every route.

Only SHA-256 hashes of tokens are stored. A verified token is cached for a few seconds so that
reads do not pay a second query; disabling or deleting a token takes effect within `ttl_s`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from controlplane.errors import Forbidden, Unauthenticated
from controlplane.services import tokens
from controlplane.services.inventory import hash_token
from controlplane.specs import Role

BEARER = HTTPBearer(
    auto_error=False,  # the verifier's 401 says how to get a token
    scheme_name="bearer",
    description="An API token (gpf_…): POST /api/v1/tokens, or the admin token printed at "
    "first start.",
)
RANK = {Role.viewer: 0, Role.operator: 1, Role.admin: 2}


@dataclass(frozen=True)
class Principal:
    token_id: str
    name: str
    role: Role

    @property
    def actor(self) -> str:
        return f"token:{self.name}"


class TokenVerifier:
    def __init__(self, factory: sessionmaker[Session], ttl_s: float = 5.0) -> None:
        self._factory = factory
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._touched: dict[str, float] = {}

    def verify(self, header: str | None) -> Principal:
        if not header or not header.lower().startswith("bearer "):
            raise Unauthenticated(
                "missing bearer token; send 'Authorization: Bearer <token>' (create one with "
                "POST /api/v1/tokens, or use the admin token printed at first start)"
            )
        digest = hash_token(header[7:].strip())
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached and cached[0] > now:
            return cached[1]
        principal = self._load(digest)
        self._cache[digest] = (now + self._ttl_s, principal)
        return principal

    def _load(self, digest: str) -> Principal:
        with self._factory() as session, session.begin():
            now = datetime.now(UTC)
            token = tokens.valid_token(session, digest, now)
            if time.monotonic() - self._touched.get(token.id, -1e9) > 60:
                tokens.mark_used(session, token.id, now)
                self._touched[token.id] = time.monotonic()
            return Principal(token.id, token.name, token.role)

    def forget(self) -> None:
        self._cache.clear()


def require(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    """A FastAPI dependency admitting `role` and every role above it."""

    async def dependency(
        request: Request,
        _: HTTPAuthorizationCredentials | None = Security(BEARER),  # documents the scheme
    ) -> Principal:
        # async: the verifier answers from its cache almost always, so no thread hop
        verifier: TokenVerifier = request.app.state.verifier
        principal = verifier.verify(request.headers.get("authorization"))
        if RANK[principal.role] < RANK[role]:
            raise Forbidden(
                f"this needs the {role.value} role; token '{principal.name}' is "
                f"{principal.role.value}. Ask an admin for a token with role {role.value}"
            )
        request.state.principal = principal
        return principal

    dependency.required_role = role  # type: ignore[attr-defined]
    return dependency
