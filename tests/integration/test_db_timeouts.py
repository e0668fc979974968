"""A process frozen mid-transaction, or a change that waits on a lock held too long, on the
real PostgreSQL: the server ends the frozen session (its locks go with it), and a waiter
fails after the lock timeout with a 503 that says to retry, instead of hanging for good."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from controlplane.api.app import create_app
from controlplane.db.session import make_engine, make_session_factory
from controlplane.settings import Settings
from tests.integration.api import builders as b
from tests.integration.conftest import Api

KEY = 0x7465_7374  # an advisory lock key no code of the product uses


def test_a_session_frozen_inside_a_transaction_is_ended_and_its_locks_freed(database_url: str):
    frozen = make_engine(database_url, pool_size=1, idle_in_transaction_s=0.5)
    other = make_engine(database_url, pool_size=1)
    try:
        with frozen.connect() as stuck:
            stuck.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": KEY})
            # ...and the process freezes here, inside its transaction
            with other.connect() as conn:
                deadline = time.monotonic() + 10
                while not conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": KEY}):
                    conn.rollback()
                    assert time.monotonic() < deadline, "the frozen session kept its lock"
                    time.sleep(0.1)
                conn.rollback()
            with pytest.raises(DBAPIError) as thawed:  # thawed: its transaction is gone
                stuck.execute(text("SELECT 1"))
            assert thawed.value.connection_invalidated  # dropped from the pool; API: a 503
    finally:
        frozen.dispose()
        other.dispose()


def test_a_change_waiting_on_a_held_lock_gets_a_503_to_retry(
    database_url: str, tokens: dict[str, str]
):
    engine = make_engine(database_url, pool_size=2, lock_timeout_s=0.5)
    holder = make_engine(database_url, pool_size=1)
    app = create_app(
        Settings(database_url=database_url), session_factory=make_session_factory(engine)
    )
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            admin = Api(client, tokens["admin"])
            assert admin.post("gpu-types", b.gpu_type()).status_code == 201
            with holder.connect() as conn:  # another change holds the row
                conn.execute(text("SELECT 1 FROM gpu_types WHERE name = 'H100-80G' FOR UPDATE"))
                began = time.monotonic()
                refused = admin.patch("gpu-types/H100-80G", {"memory_gib": 94})
                waited = time.monotonic() - began
                conn.rollback()
            assert refused.status_code == 503, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert "lock" in refused.json()["detail"] and "retry" in refused.json()["detail"]
            assert refused.headers["retry-after"]
            assert waited < 10
            assert admin.patch("gpu-types/H100-80G", {"memory_gib": 94}).status_code == 200
    finally:
        engine.dispose()
        holder.dispose()
