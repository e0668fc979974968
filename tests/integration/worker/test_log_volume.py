"""The worker logs a re-plan that changed something, not the ones every 30 s that did not."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery

from controlplane.db import models as m
from controlplane.procurement.tasks import Deps
from controlplane.settings import Settings
from controlplane.tasks import REPLAN, Worker, register
from tests.integration.api import builders as b


def _replan(session_factory: Any) -> Any:
    app = Celery("test-worker", set_as_current=False)
    deps = Deps(factory=session_factory, providers=lambda row: None, replan=lambda reason: None)  # type: ignore[arg-type]
    register(app, lambda: Worker(Settings(), deps))
    return app.tasks[REPLAN]


def test_a_replan_that_moves_nothing_is_not_logged_at_info(
    admin: Any, session_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    b.seed(admin)
    assert admin.post("deployments", b.deployment()).status_code == 201
    with session_factory() as s, s.begin():
        s.query(m.Cluster).filter_by(name="use1-a").one().state = "healthy"
    replan = _replan(session_factory)
    with caplog.at_level(logging.INFO, logger="gpufleet.tasks"):
        replan.run(reason="timer")  # places chat-llm: a change
        replan.run(reason="timer")  # the same plan again
        replan.run(reason="demand")
    said = [r.getMessage() for r in caplog.records if r.name == "gpufleet.tasks"]
    assert len(said) == 1, said
    assert "1 change(s)" in said[0]
