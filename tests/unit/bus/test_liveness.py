from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.liveness import (
    Breaker,
    BusProgress,
    CatchUp,
    Liveness,
    cluster_liveness,
    judge,
    liveness_changes,
)

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


# --- the evidence horizon and the circuit breaker (issue 12 item 2) ------------------------

S = timedelta(seconds=1)
THREE = ("a", "b", "c")


def _healthy(*names: str) -> dict[str, Liveness]:
    return dict.fromkeys(names, "healthy")  # type: ignore[return-value]


def test_catch_up_is_the_newest_sample_the_ack_floor_covers():
    catch_up = CatchUp()
    assert catch_up.observe(T0, 10, 10) == T0
    assert catch_up.observe(T0 + 2 * S, 14, 11) == T0  # 12..14 not processed yet
    assert catch_up.observe(T0 + 4 * S, 20, 14) == T0 + 2 * S
    assert catch_up.observe(T0 + 6 * S, 20, 20) == T0 + 6 * S
    assert catch_up.samples == []


def test_catch_up_stands_still_while_nothing_is_processed():
    catch_up = CatchUp()
    catch_up.observe(T0, 5, 5)
    for i in range(1, 30):
        assert catch_up.observe(T0 + i * S, 5 + i, 5) == T0


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=30))
def test_catch_up_never_goes_back_and_never_passes_the_last_sample(steps):
    catch_up, last, floor = CatchUp(), 0, 0
    seen: list[datetime] = []
    for i, (published, processed) in enumerate(steps):
        last += published
        floor = min(last, floor + processed)
        at = catch_up.observe(T0 + i * S, last, floor)
        if at is not None:
            assert at <= T0 + i * S
            assert not seen or at >= seen[-1]
            seen.append(at)


def test_a_frozen_bus_suspends_liveness_instead_of_declaring_everyone_down():
    beats = {c: T0 for c in THREE}
    frozen = BusProgress(alive_at=T0, caught_up_at=T0)
    verdict = judge(_healthy(*THREE), beats, T0 + 90 * S, STALE, DOWN, frozen)
    assert verdict.changes == {}
    assert verdict.suspended and "no progress for 90 s" in verdict.suspended


def test_a_bus_lagging_behind_the_stream_suspends_liveness():
    beats = {c: T0 for c in THREE}
    lagging = BusProgress(alive_at=T0 + 89 * S, caught_up_at=T0, pending=4000)
    verdict = judge(_healthy(*THREE), beats, T0 + 90 * S, STALE, DOWN, lagging)
    assert verdict.changes == {}
    assert verdict.suspended and "behind the reports stream (4000" in verdict.suspended


def test_a_bus_that_never_caught_up_suspends_liveness():
    beats = {c: T0 for c in THREE}
    starting = BusProgress(alive_at=T0 + 90 * S, caught_up_at=None, pending=90_000)
    verdict = judge(_healthy(*THREE), beats, T0 + 90 * S, STALE, DOWN, starting)
    assert verdict.changes == {}
    assert verdict.suspended and "not caught up" in verdict.suspended


def test_silence_counts_only_up_to_what_the_bus_had_processed():
    beats = {"a": T0, "b": T0 + 50 * S, "c": T0 + 50 * S}
    progress = BusProgress(alive_at=T0 + 61 * S, caught_up_at=T0 + 59 * S)
    verdict = judge(_healthy(*THREE), beats, T0 + 61 * S, STALE, DOWN, progress)
    assert verdict.changes == {"a": ("healthy", "stale")}  # 59 s of silence, not 61
    assert verdict.suspended is None


def test_one_silent_cluster_among_many_goes_down():
    beats = {"a": T0, "b": T0 + 60 * S, "c": T0 + 60 * S}
    progress = BusProgress(alive_at=T0 + 60 * S, caught_up_at=T0 + 60 * S)
    verdict = judge(_healthy(*THREE), beats, T0 + 60 * S, STALE, DOWN, progress)
    assert verdict.changes == {"a": ("healthy", "down")}
    assert verdict.suspended is None


def test_most_clusters_silent_at_once_trips_the_breaker():
    beats = {"a": T0, "b": T0, "c": T0 + 60 * S}
    progress = BusProgress(alive_at=T0 + 60 * S, caught_up_at=T0 + 60 * S)
    verdict = judge(_healthy(*THREE), beats, T0 + 60 * S, STALE, DOWN, progress)
    assert verdict.changes == {"a": ("healthy", "stale"), "b": ("healthy", "stale")}
    assert verdict.suspended and "2 of 3 clusters (a, b) went silent at once" in verdict.suspended


def test_the_breaker_needs_at_least_min_clusters():
    beats = {"a": T0, "b": T0 + 60 * S}
    progress = BusProgress(alive_at=T0 + 60 * S, caught_up_at=T0 + 60 * S)
    tight = Breaker(fraction=0.5, min_clusters=2)
    verdict = judge(_healthy("a", "b"), beats, T0 + 60 * S, STALE, DOWN, progress, tight)
    assert verdict.changes == {"a": ("healthy", "down")}


@given(
    st.lists(st.floats(0, 200), min_size=2, max_size=8),
    st.floats(0, 300),
    st.floats(0, 300),
)
def test_no_cluster_goes_down_for_silence_the_bus_could_not_hear(silences, lag, age):
    """Whatever the heartbeats, a cluster heard from less than `down_after` before the
    horizon never goes down, and nothing goes down while the bus is behind."""
    now = T0 + timedelta(seconds=400)
    beats = {f"c{i}": now - timedelta(seconds=s) for i, s in enumerate(silences)}
    progress = BusProgress(
        alive_at=now - timedelta(seconds=age), caught_up_at=now - timedelta(seconds=max(lag, age))
    )
    verdict = judge(dict.fromkeys(beats, "healthy"), beats, now, STALE, DOWN, progress)
    horizon = now - timedelta(seconds=max(lag, age))
    for cluster, (_, new) in verdict.changes.items():
        if new == "down":
            assert verdict.suspended is None
            assert horizon - beats[cluster] >= DOWN
    went_down = [c for c, (_, new) in verdict.changes.items() if new == "down"]
    assert len(went_down) < 2 or len(went_down) < 0.5 * len(beats)


def test_a_fleet_wide_silence_crossing_the_line_over_two_checks_moves_nothing():
    """Heartbeats every 5 s with their own phases, checks every 5 s: a cut between the
    planes and NATS (the bus process itself fine) reaches down_after for some clusters one
    check before the others. Counting only those crossing in one check, 4 of 10 went down
    (and were re-placed) before the other 6 tripped the breaker."""
    names = [f"c{i}" for i in range(10)]
    beats = {n: T0 + (95 + 0.5 * i) * S for i, n in enumerate(names)}  # silent from ~100 s
    state: dict[str, Liveness] = dict.fromkeys(names, "healthy")
    for k in range(41):
        now = T0 + (100 + 2.5 * k) * S
        progress = BusProgress(alive_at=now, caught_up_at=now)
        verdict = judge(state, beats, now, STALE, DOWN, progress)
        for cluster, (_, new) in verdict.changes.items():
            state[cluster] = new
        assert "down" not in state.values(), (now, state)


def test_a_cluster_down_long_ago_does_not_make_the_next_one_trip_the_breaker():
    """A cluster already down is not "silent at once" with a new failure: in a small
    fleet it kept every later death from being declared."""
    beats = {"a": T0, "b": T0 + 200 * S, "c": T0 + 260 * S}
    progress = BusProgress(alive_at=T0 + 260 * S, caught_up_at=T0 + 260 * S)
    previous: dict[str, Liveness] = {"a": "down", "b": "healthy", "c": "healthy"}
    verdict = judge(previous, beats, T0 + 260 * S, STALE, DOWN, progress)
    assert verdict.changes == {"b": ("healthy", "down")} and verdict.suspended is None
