"""What a provider error on an acquire means: retried with backoff, or the pool blocked
for a while with one re-plan; `core.on_failure`'s table, one scenario per row."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.procurement.core import (
    Backoff,
    Blocked,
    Policy,
    backoff_s,
    on_failure,
    retry_in_s,
)
from providers.base import InsufficientCapacity, InvalidRequest, QuotaExceeded, Throttled

from .builders import NOW

POLICY = Policy(exhausted_cooldown_s=300, quota_cooldown_s=1800, max_retries=6)


def blocked(error: str, block: Blocked, cooldown_s: float, replan: str) -> Backoff:
    until = NOW + timedelta(seconds=cooldown_s)
    return Backoff(error, block=block, until=until, replan=replan)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (Throttled("slow down"), Backoff("Throttled", retry=True)),
        (
            InsufficientCapacity("no L4"),
            blocked("InsufficientCapacity", "exhausted", 300, "capacity_exhausted"),
        ),
        (
            QuotaExceeded("raise it"),
            blocked("QuotaExceeded", "quota_exceeded", 1800, "quota_exceeded"),
        ),
        (
            InvalidRequest("no such type"),
            blocked("InvalidRequest", "failing", 1800, "procurement_failed"),
        ),
    ],
)
def test_each_error_ends_the_way_the_table_says(error, expected):
    assert on_failure(error, NOW, POLICY) == expected


def test_backoff_is_exponential_with_full_jitter_and_capped():
    assert backoff_s(0, 0.999, base_s=1) < 1
    assert backoff_s(3, 0.5, base_s=1) == 4
    assert backoff_s(30, 0.999, base_s=1, cap_s=60) < 60
    assert backoff_s(5, 0.0) == 0


def test_a_throttled_task_retries_until_its_retries_are_spent_then_the_sweep_resumes_it():
    delays = [retry_in_s(attempt, 0.999, POLICY) for attempt in range(8)]
    assert delays[6:] == [None, None]
    assert all(d is not None and d < min(60, 2**n) for n, d in enumerate(delays[:6]))
