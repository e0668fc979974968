"""The API binds each request's X-Request-Id (cleaned, or a new one) while it is served: the
change's audit entry, the hook that asks for a re-plan (and so the Celery task) and the
error log of a 500 all carry it, and the 500 answer names it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.settings import Settings
from gpufleet_logging import current_request_id
from tests.integration.api import builders as b
from tests.integration.conftest import Api


@pytest.fixture
def hooked(database_url: str, session_factory: Any, tokens: dict[str, str]) -> Iterator[tuple[Api, list[Any]]]:  # fmt: skip
    heard: list[Any] = []
    broken = APIRouter()

    @broken.get("/broken")
    def fail() -> None:
        raise RuntimeError("a bug")

    app = create_app(
        Settings(database_url=database_url),
        session_factory=session_factory,
        extra_routers=[broken],
        on_inventory_change=lambda kind: heard.append((kind, current_request_id())),
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Api(client, tokens["admin"]), heard


def test_a_write_and_its_replan_hook_carry_the_clients_request_id(hooked: Any) -> None:
    api, heard = hooked
    b.seed(api)
    heard.clear()
    created = api.post("deployments", b.deployment(), **{"X-Request-Id": "req-apply-1"})
    assert created.status_code == 201, created.text
    assert created.headers["x-request-id"] == "req-apply-1"
    assert heard == [("Deployment", "req-apply-1")]
    entry = api.get("audit", resource_kind="Deployment").json()["items"][0]
    assert entry["request_id"] == "req-apply-1"
    assert current_request_id() is None  # unbound after the request


def test_an_id_from_the_client_is_cleaned_and_a_missing_one_made(hooked: Any) -> None:
    api, _ = hooked
    long = api.client.get("/healthz", headers={"X-Request-Id": "r" * 300})
    assert long.headers["x-request-id"] == "r" * 64
    made = api.client.get("/healthz")
    assert len(made.headers["x-request-id"]) == 32


def test_a_500_names_its_request_id_in_the_answer_and_the_log(hooked: Any, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    api, _ = hooked
    with caplog.at_level(logging.ERROR, logger="gpufleet.api"):
        answer = api.client.get("/api/v1/broken", headers={"X-Request-Id": "req-500"})
    assert answer.status_code == 500
    assert answer.headers["x-request-id"] == "req-500"
    (record,) = [r for r in caplog.records if r.name == "gpufleet.api"]
    assert getattr(record, "request_id", None) == "req-500" and record.exc_info
