"""Dashboard sessions are server-side: the cookie carried the API token itself, so logging
out revoked nothing and a copied cookie was the token. Now the cookie is a random session
id (only its hash stored), logging out ends every copy of it, and a session ends with its
token or after its lifetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from controlplane.dashboard.session import COOKIE, csrf_for
from controlplane.db.models import ApiToken, DashboardSession
from controlplane.services.inventory import Actor, hash_token
from controlplane.services.sessions import SESSION_LIFETIME, SessionStore
from controlplane.services.tokens import set_disabled

pytestmark = pytest.mark.integration


def sign_in(client: TestClient, token: str) -> str:
    answer = client.post("/login", data={"token": token}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return answer.cookies[COOKIE]


def lets_in(client: TestClient, cookie: str) -> bool:
    client.cookies.clear()
    client.cookies.set(COOKIE, cookie)
    return client.get("/pools", follow_redirects=False).status_code == 200


def test_the_cookie_is_a_session_id_stored_hashed_never_the_token(
    app_client, tokens, session_factory
):
    cookie = sign_in(app_client, tokens["viewer"])
    assert tokens["viewer"] not in cookie and not cookie.startswith("gpf_")
    with session_factory() as db:
        stored = db.scalars(select(DashboardSession.id_hash)).all()
    assert stored == [hash_token(cookie)]
    assert lets_in(app_client, cookie)
    assert not lets_in(app_client, tokens["viewer"]), "the token itself is no session"


def test_logging_out_ends_the_session_and_every_copy_of_its_cookie(app_client, tokens):
    cookie = sign_in(app_client, tokens["admin"])
    other = sign_in(app_client, tokens["admin"])  # a second sign-in of the same token
    assert lets_in(app_client, cookie)
    out = app_client.post("/logout", data={"csrf": csrf_for(cookie)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert not lets_in(app_client, cookie), "a copy of the cookie still signed in"
    assert lets_in(app_client, other), "only that session ended"


def test_a_disabled_token_ends_its_sessions(app_client, tokens, session_factory):
    app_client.app.state.dashboard_sessions = SessionStore(session_factory, ttl_s=0)
    cookie = sign_in(app_client, tokens["viewer"])
    assert lets_in(app_client, cookie)
    with session_factory() as db, db.begin():
        set_disabled(db, "viewer-token", True, Actor("test"))
    assert not lets_in(app_client, cookie)


def test_a_session_lasts_its_lifetime_then_its_row_goes(session_factory, tokens):
    now = [datetime(2026, 12, 1, tzinfo=UTC)]
    store = SessionStore(session_factory, ttl_s=0, clock=lambda: now[0])
    with session_factory() as db:
        token_id = db.scalars(select(ApiToken.id).where(ApiToken.name == "viewer-token")).one()
    first = store.open(token_id)
    now[0] += SESSION_LIFETIME - timedelta(seconds=1)
    assert store.token(first) is not None
    now[0] += timedelta(seconds=1)
    assert store.token(first) is None
    store.open(token_id)  # a sign-in drops the expired sessions
    with session_factory() as db:
        assert hash_token(first) not in db.scalars(select(DashboardSession.id_hash)).all()
    assert store.token("x" * 10_000) is None  # an oversized cookie is no session
