"""Dashboard sessions are server-side: the cookie carried the API token itself, so logging
out revoked nothing and a copied cookie was the token. Now the cookie is a random session
id (only its hash stored), logging out ends every copy of it, and a session ends with its
token or after its lifetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from controlplane.dashboard.session import COOKIE, csrf_for
from controlplane.db.models import ApiToken, DashboardSession
from controlplane.services.inventory import hash_token
from controlplane.services.sessions import MAX_PER_TOKEN, SESSION_LIFETIME, SessionStore

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
    app_client.cookies.clear()
    other = sign_in(app_client, tokens["admin"])  # another browser, the same token
    assert lets_in(app_client, cookie)
    out = app_client.post("/logout", data={"csrf": csrf_for(cookie)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert not lets_in(app_client, cookie), "a copy of the cookie still signed in"
    assert lets_in(app_client, other), "only that session ended"


def test_signing_in_again_in_one_browser_ends_the_session_it_held(app_client, tokens):
    first = sign_in(app_client, tokens["viewer"])
    second = sign_in(app_client, tokens["admin"])  # the browser sends the first cookie
    assert not lets_in(app_client, first) and lets_in(app_client, second)


def test_a_token_disabled_from_the_dashboard_ends_its_sessions_for_good(app_client, tokens):
    viewer = sign_in(app_client, tokens["viewer"])
    app_client.cookies.clear()
    admin = sign_in(app_client, tokens["admin"])
    assert lets_in(app_client, viewer)  # read now: in this process's cache
    app_client.cookies.set(COOKIE, admin)
    for verb in ("disable", "enable"):
        done = app_client.post(f"/tokens/viewer-token/{verb}", data={"csrf": csrf_for(admin)})
        assert done.status_code == 200, done.text
        # at once, not after the cache time; and enabling it again revives no session
        assert not lets_in(app_client, viewer), f"after {verb}"
        app_client.cookies.set(COOKIE, admin)
    assert sign_in(app_client, tokens["viewer"])  # the token itself signs in again


def test_sessions_per_token_are_bounded_and_a_deleted_token_opens_none(session_factory, tokens):
    store = SessionStore(session_factory, ttl_s=0)
    with session_factory() as db:
        token_id = db.scalars(select(ApiToken.id).where(ApiToken.name == "viewer-token")).one()
    first = store.open(token_id)
    assert first is not None
    opened = [store.open(token_id) for _ in range(MAX_PER_TOKEN)]
    assert store.token(first) is None, "the oldest ended"
    assert all(sid is not None and store.token(sid) for sid in opened)
    with session_factory() as db:
        count = db.scalar(select(func.count()).select_from(DashboardSession))
    assert count == MAX_PER_TOKEN
    assert store.open("no-such-token-id") is None  # deleted since it was verified


def test_a_session_lasts_its_lifetime_then_its_row_goes(session_factory, tokens):
    now = [datetime(2026, 12, 1, tzinfo=UTC)]
    store = SessionStore(session_factory, ttl_s=0, clock=lambda: now[0])
    with session_factory() as db:
        token_id = db.scalars(select(ApiToken.id).where(ApiToken.name == "viewer-token")).one()
    first = store.open(token_id)
    assert first is not None
    now[0] += SESSION_LIFETIME - timedelta(seconds=1)
    assert store.token(first) is not None
    now[0] += timedelta(seconds=1)
    assert store.token(first) is None
    store.open(token_id)  # a sign-in drops the expired sessions
    with session_factory() as db:
        assert hash_token(first) not in db.scalars(select(DashboardSession.id_hash)).all()
    assert store.token("x" * 10_000) is None  # an oversized cookie is no session
