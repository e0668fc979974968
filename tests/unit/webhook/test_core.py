"""The webhook export's pure rules: what an answer means, the backoff, severities."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.webhook.core import Outcome, next_attempt, outcome_of, severity_of

NOW = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(200, Outcome.DELIVERED), (204, Outcome.DELIVERED), (None, Outcome.RETRY),
     (500, Outcome.RETRY), (503, Outcome.RETRY), (429, Outcome.RETRY), (408, Outcome.RETRY),
     (400, Outcome.REJECTED), (413, Outcome.REJECTED), (422, Outcome.REJECTED),
     (401, Outcome.RETRY), (403, Outcome.RETRY), (404, Outcome.RETRY), (301, Outcome.RETRY),
     (308, Outcome.RETRY)],
)  # fmt: skip
def test_what_an_answer_means(status: int | None, outcome: Outcome) -> None:
    assert outcome_of(status) is outcome


def test_the_backoff_doubles_up_to_five_minutes() -> None:
    waits = [(next_attempt(n, NOW) - NOW).total_seconds() for n in range(1, 12)]
    assert waits[:5] == [1, 2, 4, 8, 16]
    assert max(waits) == 300 and waits[-1] == 300
    assert next_attempt(1000, NOW) - NOW == timedelta(minutes=5)


def test_what_went_wrong_is_a_warning() -> None:
    assert severity_of("ReplicaFailed") == "warning"
    assert severity_of("ClusterDown") == "warning"
    assert severity_of("PlacementChanged") == "info"
