"""An API write asks for a re-plan without waiting for the broker, and bursts coalesce."""

from __future__ import annotations

import threading
import time

from controlplane.api.main import _send_replan
from controlplane.replans import ReplanRequests


def test_requests_never_block_and_a_burst_becomes_one_more_send(monkeypatch):
    from controlplane.tasks import celery_app

    release, sent = threading.Event(), []
    first_sent, second_sent = threading.Event(), threading.Event()

    def slow_broker(name, kwargs, retry):
        sent.append(kwargs["reason"])
        (first_sent if len(sent) == 1 else second_sent).set()
        assert release.wait(10)  # a broker that hangs until the test lets it go

    monkeypatch.setattr(celery_app, "send_task", slow_broker)
    requests = ReplanRequests(_send_replan, min_gap_s=0.0)
    requests.changed("Pool")
    assert first_sent.wait(5)

    started = time.monotonic()
    for kind in ("Pool", "Cluster", "Deployment", "Pool"):
        requests.changed(kind)  # while the sender is stuck on the broker
    assert time.monotonic() - started < 0.05

    release.set()
    assert second_sent.wait(5)
    assert sent == ["Pool changed", "Cluster changed, Deployment changed, Pool changed"]
