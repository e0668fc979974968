from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.liveness import cluster_liveness, liveness_changes

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STALE, DOWN = timedelta(seconds=15), timedelta(seconds=60)


@pytest.mark.parametrize(
    ("silence", "expected"),
    [
        (0, "healthy"),
        (14.9, "healthy"),
        (15, "stale"),
        (59.9, "stale"),
        (60, "down"),
        (900, "down"),
    ],
)
def test_liveness_by_silence(silence: float, expected: str):
    assert cluster_liveness(T0, T0 + timedelta(seconds=silence), STALE, DOWN) == expected


def test_never_heard_from_is_down():
    assert cluster_liveness(None, T0, STALE, DOWN) == "down"


def test_thresholds_must_be_ordered():
    with pytest.raises(ValueError, match="down_after"):
        cluster_liveness(T0, T0, DOWN, STALE)


@given(st.floats(0, 1000), st.floats(0, 1000))
def test_liveness_only_worsens_with_silence(a: float, b: float):
    order = {"healthy": 0, "stale": 1, "down": 2}
    short, long = sorted((a, b))
    first = cluster_liveness(T0, T0 + timedelta(seconds=short), STALE, DOWN)
    second = cluster_liveness(T0, T0 + timedelta(seconds=long), STALE, DOWN)
    assert order[first] <= order[second]


def test_changes_report_only_transitions():
    beats = {"a": T0, "b": T0 + timedelta(seconds=50)}
    now = T0 + timedelta(seconds=61)
    assert liveness_changes({}, beats, now, STALE, DOWN) == {
        "a": (None, "down"),
        "b": (None, "healthy"),
    }
    assert liveness_changes({"a": "down", "b": "healthy"}, beats, now, STALE, DOWN) == {}
    assert liveness_changes(
        {"a": "down", "b": "healthy"}, beats, now + timedelta(seconds=5), STALE, DOWN
    ) == {"b": ("healthy", "stale")}
