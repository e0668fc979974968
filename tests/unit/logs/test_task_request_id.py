"""API → Celery task: a task sent while a request id is bound runs with it bound (and the
follow-ups it sends too); a coalesced re-plan carries the first write's id. A real worker
(in a thread) on Celery's in-memory broker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import controlplane.tasks  # noqa: F401  # its signal receivers carry and bind the request id
from controlplane.replans import ReplanRequests
from gpufleet_logging import current_request_id, request_id_bound


@pytest.fixture
def app(logging_restored: None) -> Iterator[Celery]:
    app = Celery("rid-test", broker="memory://", backend="cache+memory://", set_as_current=False)

    @app.task(name="t.seen", shared=False)
    def seen() -> str | None:
        return current_request_id()

    @app.task(name="t.follow_up", shared=False)
    def follow_up() -> str | None:
        return app.send_task("t.seen").id  # sent from inside a task: carries its id

    worker: Any = start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING")
    with worker:  # (typed as an Iterable by celery)
        yield app


def test_a_task_runs_with_the_request_id_it_was_sent_under(app: Celery) -> None:
    with request_id_bound("req-api-1"):
        bound = app.send_task("t.seen")
        parent = app.send_task("t.follow_up")
    unbound = app.send_task("t.seen")
    assert bound.get(timeout=10) == "req-api-1"
    child_id = parent.get(timeout=10)
    assert app.AsyncResult(child_id).get(timeout=10) == "req-api-1"
    assert unbound.get(timeout=10) is None
    assert current_request_id() is None


def test_a_coalesced_replan_carries_the_first_writes_request_id() -> None:
    release, sent = threading.Event(), []
    first, second = threading.Event(), threading.Event()

    def send(reason: str) -> None:  # a broker that hangs until the test lets it go
        sent.append((reason, current_request_id()))
        (first if len(sent) == 1 else second).set()
        assert release.wait(10)

    requests = ReplanRequests(send, min_gap_s=0.0)
    with request_id_bound("w1"):
        requests.changed("Pool")
    assert first.wait(5)
    for rid, kind in (("w2", "Cluster"), ("w3", "Deployment")):
        with request_id_bound(rid):
            requests.changed(kind)  # while the sender is stuck
    release.set()
    assert second.wait(5)
    assert sent == [("Pool changed", "w1"), ("Cluster changed, Deployment changed", "w2")]
