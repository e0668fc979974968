"""Integration fixtures: an API client on the real PostgreSQL with one token per role; every
test that asks for `tokens` starts from an empty database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from controlplane.api.app import create_app
from controlplane.db.base import Base
from controlplane.db.session import make_engine, make_session_factory
from controlplane.services import inventory
from controlplane.services.resources import KINDS
from controlplane.settings import Settings
from controlplane.specs import Role, TokenSpec


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


def _truncate(engine: Engine) -> None:
    names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} CASCADE"))


@pytest.fixture
def tokens(session_factory: sessionmaker[Session], engine: Engine) -> Iterator[dict[str, str]]:
    _truncate(engine)
    secrets: dict[str, str] = {}
    with session_factory() as session, session.begin():
        for role in Role:
            spec = TokenSpec(name=f"{role.value}-token", role=role)
            result = inventory.create(session, KINDS["tokens"], spec, inventory.Actor("test"))
            assert result.secrets
            secrets[role.value] = result.secrets["token"]
    yield secrets
    _truncate(engine)


@pytest.fixture
def app_client(database_url: str, session_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    app = create_app(Settings(database_url=database_url), session_factory=session_factory)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


class Api:
    """A tiny client that speaks as one role: `api.post("pools", {...})`."""

    def __init__(self, client: TestClient, token: str | None) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _url(self, path: str) -> str:
        return path if path.startswith("/") else f"/api/v1/{path}"

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(self._url(path), headers=self.headers, params=params)

    def post(self, path: str, body: Any, **headers: str) -> Any:
        return self.client.post(self._url(path), headers=self.headers | headers, json=body)

    def put(self, path: str, body: Any, **headers: str) -> Any:
        return self.client.put(self._url(path), headers=self.headers | headers, json=body)

    def patch(self, path: str, body: Any, **headers: str) -> Any:
        return self.client.patch(self._url(path), headers=self.headers | headers, json=body)

    def delete(self, path: str, **headers: str) -> Any:
        return self.client.delete(self._url(path), headers=self.headers | headers)


@pytest.fixture
def admin(app_client: TestClient, tokens: dict[str, str]) -> Api:
    return Api(app_client, tokens["admin"])


@pytest.fixture
def operator(app_client: TestClient, tokens: dict[str, str]) -> Api:
    return Api(app_client, tokens["operator"])


@pytest.fixture
def viewer(app_client: TestClient, tokens: dict[str, str]) -> Api:
    return Api(app_client, tokens["viewer"])
