"""Invariants of the local autoscaling policy, checked with hypothesis on a simulated clock."""

from __future__ import annotations

import itertools
import math
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloadplane.autoscaling import Policy, ReplicaSignal, ScaleAction, Signals, State, decide
from workloadplane.autoscaling_sim import (
    EPOCH,
    PolicyController,
    max_reversals_per_window,
    reversals,
    simulate,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SIMS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    low = draw(st.integers(0, 4))
    return Policy(
        min_replicas=low,
        max_replicas=draw(st.integers(max(1, low), 30)),
        window_seconds=float(draw(st.integers(10, 90))),
        scale_down_delay_seconds=float(draw(st.integers(0, 150))),
        target_concurrency=float(draw(st.integers(1, 16))),
        scale_to_zero_idle_seconds=draw(st.sampled_from([None, 30.0, 120.0])),
    )


@st.composite
def signals(draw: st.DrawFn) -> Signals:
    ready = draw(st.integers(0, 8))
    starting = draw(st.integers(0, 3))
    replicas = [
        ReplicaSignal(
            f"r{i}",
            "ready",
            in_flight=draw(st.integers(0, 20)),
            kv_cache_usage_perc=draw(st.floats(0, 1)),
            num_requests_waiting=draw(st.sampled_from([0.0, 0.0, 3.0])),
        )
        for i in range(ready)
    ]
    replicas += [ReplicaSignal(f"s{i}", "starting") for i in range(starting)]
    return Signals(replicas=tuple(replicas), queued=draw(st.integers(0, 60)))


@st.composite
def histories(draw: st.DrawFn) -> tuple[Policy, State, Signals, int]:
    """A policy, the state after a random history, the next signals and the tick index."""
    policy = draw(policies())
    state = State()
    steps = draw(st.lists(signals(), min_size=0, max_size=40))
    for i, s in enumerate(steps):
        _, state = decide(policy, state, s, EPOCH + timedelta(seconds=i))
    return policy, state, draw(signals()), len(steps)


@FAST
@given(histories())
def test_desired_stays_within_min_and_max(case: tuple[Policy, State, Signals, int]) -> None:
    policy, state, sig, i = case
    now = EPOCH + timedelta(seconds=i)
    decision, _ = decide(policy, state, sig, now)
    assert policy.min_at(now) <= decision.desired_replicas <= policy.max_replicas
    assert decision.unconstrained_desired >= 0


@FAST
@given(histories(), st.integers(1, 100))
def test_desired_is_monotone_in_load(case: tuple[Policy, State, Signals, int], extra: int) -> None:
    policy, state, sig, i = case
    now = EPOCH + timedelta(seconds=i)
    low, _ = decide(policy, state, sig, now)
    more = Signals(replicas=sig.replicas, queued=sig.queued + extra)
    high, _ = decide(policy, state, more, now)
    assert high.desired_replicas >= low.desired_replicas
    assert high.unconstrained_desired >= low.unconstrained_desired


@FAST
@given(histories())
def test_panic_triggers_only_at_twice_ready_capacity(
    case: tuple[Policy, State, Signals, int],
) -> None:
    policy, state, sig, i = case
    now = EPOCH + timedelta(seconds=i)
    calm = State(
        samples=state.samples, observed_since=state.observed_since, last_ready=state.last_ready
    )
    decision, after = decide(policy, calm, sig, now)
    t = now.timestamp()
    short = [v for s, v in after.samples if s > t - policy.window_seconds * 0.1]
    confirmed = min(short[-2:]) if len(short) >= 2 else 0.0
    level = max(sum(short) / len(short), confirmed)
    capacity = max(1, decision.ready_replicas) * policy.target_concurrency
    assert decision.panic == (level >= 2 * capacity)


load_levels = st.lists(st.integers(0, 120), min_size=2, max_size=8)


@SIMS
@given(policies(), load_levels, st.integers(5, 60), st.integers(0, 45))
def test_scale_down_only_after_the_delay(
    policy: Policy, levels: list[int], hold: int, cold: int
) -> None:
    controller = PolicyController(policy)
    duration = len(levels) * hold * 3

    def load(t: float) -> float:
        return levels[int(t // hold) % len(levels)]

    simulate(
        controller,
        load,
        duration=duration,
        target_concurrency=policy.target_concurrency,
        cold_start_seconds=cold,
        initial_replicas=policy.min_replicas,
    )
    delay = policy.effective_scale_down_delay
    last_up = 0.0
    for t, d in controller.decisions:
        if d.action == ScaleAction.SCALE_UP:
            last_up = t
        elif d.action == ScaleAction.SCALE_DOWN and d.desired_replicas > 0:
            assert t - last_up >= delay, d.reason
            assert t >= policy.window_seconds
        if d.panic:
            assert d.action != ScaleAction.SCALE_DOWN


@SIMS
@given(
    window=st.integers(10, 90),
    delay=st.integers(0, 180),
    target=st.integers(1, 16),
    low=st.integers(0, 60),
    swing=st.integers(1, 200),
    half_fraction=st.floats(0.02, 0.5),
    cold=st.integers(0, 60),
    initial=st.integers(0, 10),
)
def test_square_wave_reverses_at_most_once_per_window(
    window: int,
    delay: int,
    target: int,
    low: int,
    swing: int,
    half_fraction: float,
    cold: int,
    initial: int,
) -> None:
    """A load that oscillates faster than the window is not chased: at most one reversal in
    any window, and none once the first window and delay have passed."""
    policy = Policy(
        min_replicas=0,
        max_replicas=60,
        window_seconds=float(window),
        scale_down_delay_seconds=float(delay),
        target_concurrency=float(target),
        scale_to_zero_idle_seconds=None,
    )
    half = max(1, math.floor(window * half_fraction))
    high = low + swing
    ticks = simulate(
        PolicyController(policy),
        lambda t: high if (t // half) % 2 == 0 else low,
        duration=3 * (window + policy.effective_scale_down_delay) + 2 * cold + 60,
        target_concurrency=float(target),
        cold_start_seconds=cold,
        initial_replicas=initial,
    )
    flips = reversals(ticks)
    assert max_reversals_per_window(flips, window) <= 1, flips
    assert len(flips) <= 1, flips


@SIMS
@given(
    window=st.integers(10, 90),
    delay=st.integers(0, 180),
    half=st.integers(1, 400),
    swing=st.integers(1, 200),
)
def test_square_wave_of_any_period_waits_a_delay_between_up_and_down(
    window: int, delay: int, half: int, swing: int
) -> None:
    """Slower waves are followed, but never faster than one scale-down delay per reversal."""
    policy = Policy(
        min_replicas=1,
        max_replicas=60,
        window_seconds=float(window),
        scale_down_delay_seconds=float(delay),
        target_concurrency=8.0,
        scale_to_zero_idle_seconds=None,
    )
    ticks = simulate(
        PolicyController(policy),
        lambda t: swing if (t // half) % 2 == 0 else 0,
        duration=1500,
        target_concurrency=8.0,
        cold_start_seconds=20,
        initial_replicas=1,
    )
    last_change = None
    for before, tick in itertools.pairwise(ticks):
        if tick.current < before.current and last_change is not None:
            assert tick.t - last_change >= policy.effective_scale_down_delay
        if tick.current != before.current:
            last_change = tick.t
