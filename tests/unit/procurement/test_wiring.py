"""The worker runs every task the beat schedule, the re-plan requests and the procurement
dispatch send: a name spelled differently in two places is a task that never runs."""

from __future__ import annotations

from typing import Any

from controlplane.procurement.core import Acquire, Release
from controlplane.procurement.tasks import dispatch
from controlplane.tasks import REPLAN, celery_app


def test_every_task_sent_to_the_worker_is_registered_there():
    sent: list[str] = []
    dispatch([Acquire("p", 1), Release("i", "idle")], lambda name, **_: sent.append(name))
    scheduled = {entry["task"] for entry in celery_app.conf.beat_schedule.values()}
    assert sent == ["gpufleet.acquire", "gpufleet.release"]
    assert set(sent) | scheduled | {REPLAN} <= set(celery_app.tasks)


def test_an_acquire_is_sent_with_its_request_id_as_the_task_id():
    calls: list[dict[str, Any]] = []
    action = Acquire("p", 2, "c", request_id="req-1")
    dispatch([action], lambda name, **kw: calls.append(kw))
    assert calls == [
        {
            "kwargs": {"pool_id": "p", "count": 2, "cluster_id": "c", "request_id": "req-1"},
            "task_id": "req-1",
        }
    ]


def test_a_periodic_task_not_started_before_the_next_is_due_is_dropped():
    """Not queued behind the next: while a provider answered slowly, the 0.5 s notice polls
    piled up by the thousand and starved acquires and releases."""
    for name, entry in celery_app.conf.beat_schedule.items():
        assert 0 < entry["options"]["expires"] <= entry["schedule"], name
