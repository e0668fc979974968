"""Local autoscaling policy: ``decide(policy, state, signals, now) -> (Decision, State)``.

Pure: signals and ``now`` in, a decision and the next state out; no I/O, no clock reads.
Invariants: desired replicas stay within [min, max] (min raised by the schedule);
utilisation signals only raise them; replicas are removed only after a lower recommendation
has persisted for the scale-down delay (never shorter than the window), only to a count
that would run below ``scale_down_utilisation`` of the target, and never in panic;
idle replicas are drained before busy ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta, tzinfo
from enum import StrEnum
from typing import Literal

ReplicaPhase = Literal["starting", "ready", "draining"]


class ScaleAction(StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class ScheduleRule:
    """Raise min replicas to ``min_replicas`` on ``weekdays`` (0 = Monday) from ``start`` to
    ``end`` local time in ``tz``; ``end <= start`` spans midnight (the weekday is the start's).
    ``lead_seconds`` applies the rule that much earlier, to hide the cold start."""

    weekdays: frozenset[int]
    start: time
    end: time
    min_replicas: int
    tz: tzinfo = UTC
    lead_seconds: float = 0.0

    def active_at(self, now: datetime) -> bool:
        ahead = now + timedelta(seconds=self.lead_seconds)
        return self._covers(now) or (self.lead_seconds > 0 and self._covers(ahead))

    def _covers(self, moment: datetime) -> bool:
        local = moment.astimezone(self.tz)
        clock, day = local.time().replace(tzinfo=None), local.weekday()
        if self.start < self.end:
            return day in self.weekdays and self.start <= clock < self.end
        return (day in self.weekdays and clock >= self.start) or (
            (day - 1) % 7 in self.weekdays and clock < self.end
        )


@dataclass(frozen=True, slots=True)
class Policy:
    """The deployment's autoscaling knobs, with min/max from the placement's quota."""

    min_replicas: int = 0
    max_replicas: int = 1
    window_seconds: float = 60.0
    scale_down_delay_seconds: float = 300.0
    target_concurrency: float = 8.0
    scale_to_zero_idle_seconds: float | None = 300.0  # None: never scale to zero
    panic_window_fraction: float = 0.1
    panic_threshold: float = 2.0
    # A burst seen in this many consecutive samples panics without waiting for the mean.
    panic_confirm_samples: int = 2
    # A first burst sample asks for the next one this soon rather than at the next tick, so a
    # step is confirmed within 1.5 ticks of it rather than 2 (Decision.confirm_in).
    panic_confirm_after_seconds: float = 0.5
    kv_cache_target: float = 0.9
    # A replica is removed only if the lower count would run at most this fraction of the
    # target: at 94 % of it, queueing raises in-flight + queued above the target again and
    # the count flips back within seconds (issue 12 item 7).
    scale_down_utilisation: float = 0.8
    backoff_initial_seconds: float = 10.0
    backoff_max_seconds: float = 300.0
    schedule: tuple[ScheduleRule, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} / max_replicas {self.max_replicas}: "
                "set 0 <= min_replicas <= max_replicas"
            )
        for name in (
            "window_seconds",
            "target_concurrency",
            "panic_threshold",
            "panic_confirm_after_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if not 0 < self.panic_window_fraction <= 1:
            raise ValueError("panic_window_fraction must be in (0, 1]")
        if not 0 < self.kv_cache_target <= 1:
            raise ValueError("kv_cache_target must be in (0, 1]")
        if not 0 < self.scale_down_utilisation <= 1:
            raise ValueError("scale_down_utilisation must be in (0, 1]")
        if self.scale_down_delay_seconds < 0 or self.panic_confirm_samples < 1:
            raise ValueError("scale_down_delay_seconds must be >= 0, panic_confirm_samples >= 1")

    @property
    def effective_scale_down_delay(self) -> float:
        """The delay the policy applies: ``scale_down_delay_seconds``, raised to the window
        when shorter (docs/autoscaling.md, rule 6). Shorter than the window, a load
        oscillating faster than the window flips the ceil of its mean across an integer and
        the replica count flaps. A comparison with another autoscaler gives it this delay."""
        return max(self.scale_down_delay_seconds, self.window_seconds)

    def min_at(self, now: datetime) -> int:
        scheduled = [r.min_replicas for r in self.schedule if r.active_at(now)]
        return min(self.max_replicas, max([self.min_replicas, *scheduled]))


@dataclass(frozen=True, slots=True)
class ReplicaSignal:
    replica_id: str
    phase: ReplicaPhase
    in_flight: int = 0  # router's requests in flight on this replica
    num_requests_waiting: float = 0.0  # vllm:num_requests_waiting
    kv_cache_usage_perc: float = 0.0  # vllm:kv_cache_usage_perc, 0..1


@dataclass(frozen=True, slots=True)
class Signals:
    replicas: tuple[ReplicaSignal, ...] = ()
    queued: int = 0  # requests held in the router's admission queue
    start_failures: int = 0  # replica starts that failed since the previous decision

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    @property
    def load(self) -> int:
        return self.in_flight + self.queued


@dataclass(frozen=True, slots=True)
class State:
    """What the policy remembers between ticks. Times are POSIX seconds."""

    samples: tuple[tuple[float, float], ...] = ()  # (time, in-flight + queued) in the window
    observed_since: float | None = None
    last_active_at: float | None = None  # last sample with load > 0
    below_since: float | None = None  # recommendation below current since then
    below_peak: int = 0  # highest recommendation since below_since
    panic_until: float | None = None
    failed_starts: int = 0  # consecutive
    backoff_until: float | None = None
    last_ready: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now (``action``) and why; ``desired_replicas`` is the target, always in
    [min, max]. It differs from ``current_replicas`` under HOLD only while failed starts back
    off: the caller starts nothing until ``backoff_until``."""

    action: ScaleAction
    desired_replicas: int
    current_replicas: int  # ready + starting
    ready_replicas: int
    unconstrained_desired: int  # demand before clamping to [min, max]
    demand_beyond_max: int  # report upward: the next placement may raise max
    drain: tuple[str, ...]  # stop routing to these; stop each once it has no request in flight
    reason: str
    panic: bool
    failed_starts: int
    backoff_until: datetime | None
    # Decide again this many seconds from now, not at the next tick: the last sample is a
    # burst that more samples must confirm before it panics. None: the next tick will do.
    confirm_in: float | None = None


@dataclass(frozen=True, slots=True)
class _Load:
    stable: int  # replicas for the window mean
    stable_down: int  # replicas for the window mean at scale_down_utilisation x target
    panic_level: float  # short-window load, in replicas
    burst: bool  # short window at >= panic_threshold x ready capacity
    unconfirmed: bool  # the last sample alone is a burst, not yet the short window
    utilisation: int  # replicas the vllm gauges call for


def decide(
    policy: Policy, state: State, signals: Signals, now: datetime, t: float | None = None
) -> tuple[Decision, State]:
    """Decide the replica count for one deployment at ``now`` (timezone-aware: schedule
    rules are wall-clock). ``t``: the time in seconds the windows, delays and back-off are
    measured in (a monotonic clock, so that a wall-clock step neither empties the windows
    and scales an active deployment to zero, nor stretches a back-off); ``now``'s timestamp
    when not given. One deployment's states must all use the same kind of ``t``."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware, e.g. datetime.now(UTC)")
    t = now.timestamp() if t is None else t
    state = _observe(policy, state, signals, t)
    ready = sum(1 for r in signals.replicas if r.phase == "ready")
    current = sum(1 for r in signals.replicas if r.phase in ("ready", "starting"))
    load = _measure(policy, state, signals, t, ready)
    if load.burst:
        state = replace(state, panic_until=t + policy.window_seconds)
    panic = state.panic_until is not None and t < state.panic_until

    demand = max(load.stable, load.utilisation, math.ceil(load.panic_level) if panic else 0)
    if current == 0 and signals.load > 0:  # scale from zero at once, sized to what waits
        demand = max(demand, 1, math.ceil(signals.load / policy.target_concurrency))
    idle = _idle(policy, state, t)
    keep_one = 0 if idle or current == 0 else 1
    floor = policy.min_at(now)
    up_to = _clamp(max(demand, keep_one), floor, policy.max_replicas)
    # Never scale down to a count the recent short-window load would panic straight back up.
    panic_floor = math.floor(load.panic_level / policy.panic_threshold) + 1
    down_to = _clamp(
        max(demand, load.stable_down, keep_one, panic_floor if load.panic_level > 0 else 0),
        floor,
        policy.max_replicas,
    )

    def decision(action: ScaleAction, desired: int, reason: str) -> Decision:
        return Decision(
            action=action,
            desired_replicas=desired,
            current_replicas=current,
            ready_replicas=ready,
            unconstrained_desired=demand,
            demand_beyond_max=max(0, demand - policy.max_replicas),
            drain=_pick_drain(signals, current - desired),
            reason=reason,
            panic=panic,
            failed_starts=state.failed_starts,
            backoff_until=_as_datetime(state.backoff_until, t, now),
            confirm_in=policy.panic_confirm_after_seconds
            if load.unconfirmed and not panic
            else None,
        )

    calm = replace(state, below_since=None, below_peak=0)
    why = _explain(policy, load, demand, signals.load, panic)
    if current > policy.max_replicas:
        return decision(
            ScaleAction.SCALE_DOWN, policy.max_replicas, "above max: quota lowered"
        ), calm
    if up_to > current:
        if state.backoff_until is not None and t < state.backoff_until:
            reason = (
                f"hold at {current} (want {up_to}): backing off after {state.failed_starts} "
                f"failed start(s), next try in {state.backoff_until - t:.0f}s"
            )
            return decision(ScaleAction.HOLD, up_to, reason), calm
        reason = f"scale up {current}->{up_to}: {why}"
        if up_to == floor and floor > demand:
            reason = f"scale up {current}->{up_to}: min replicas {floor}"
        return decision(ScaleAction.SCALE_UP, up_to, reason), calm
    if panic or down_to >= current:
        hold = f"hold at {current}: {why}" + ("; panic suspends scale-down" if panic else "")
        return decision(ScaleAction.HOLD, current, hold), calm
    if down_to == 0 and idle:
        return decision(ScaleAction.SCALE_DOWN, 0, f"scale to zero: {why}, idle"), calm
    if state.observed_since is None or t - state.observed_since < policy.window_seconds:
        reason = f"hold at {current}: collecting a full window before scaling down"
        return decision(ScaleAction.HOLD, current, reason), calm
    since = state.below_since if state.below_since is not None else t
    peak = max(state.below_peak, down_to)
    delay = policy.effective_scale_down_delay
    if t - since < delay:
        reason = f"hold at {current}: {why}; lower for {t - since:.0f}s of {delay:.0f}s"
        return decision(ScaleAction.HOLD, current, reason), replace(
            state, below_since=since, below_peak=peak
        )
    reason = f"scale down {current}->{peak}: {why} for {delay:.0f}s"
    return decision(ScaleAction.SCALE_DOWN, peak, reason), calm


def _observe(policy: Policy, state: State, signals: Signals, t: float) -> State:
    horizon = t - policy.window_seconds
    samples = tuple(s for s in (*state.samples, (t, float(signals.load))) if s[0] > horizon)
    ready = sum(1 for r in signals.replicas if r.phase == "ready")
    failed, backoff_until = state.failed_starts, state.backoff_until
    if ready > state.last_ready and signals.start_failures == 0:
        failed, backoff_until = 0, None  # a start succeeded
    if signals.start_failures > 0:
        failed += signals.start_failures
        wait = policy.backoff_initial_seconds * 2 ** min(failed - 1, 30)
        backoff_until = t + min(policy.backoff_max_seconds, wait)
    return replace(
        state,
        samples=samples,
        observed_since=state.observed_since if state.observed_since is not None else t,
        last_active_at=t if signals.load > 0 else state.last_active_at,
        failed_starts=failed,
        backoff_until=backoff_until,
        last_ready=ready,
    )


def _measure(policy: Policy, state: State, signals: Signals, t: float, ready: int) -> _Load:
    target = policy.target_concurrency
    loads = [v for _, v in state.samples]
    short_horizon = t - policy.window_seconds * policy.panic_window_fraction
    short = [v for s, v in state.samples if s > short_horizon]
    level = sum(short) / len(short)
    confirm = policy.panic_confirm_samples
    if len(short) >= confirm:
        level = max(level, min(short[-confirm:]))
    panic_level = level / target
    mean = sum(loads) / len(loads)
    bursting = policy.panic_threshold * max(1, ready)
    burst = panic_level >= bursting
    return _Load(
        stable=math.ceil(mean / target - 1e-9),
        stable_down=math.ceil(mean / (target * policy.scale_down_utilisation) - 1e-9),
        panic_level=panic_level,
        burst=burst,
        unconfirmed=not burst and signals.load / target >= bursting,
        utilisation=_utilisation_desired(policy, signals),
    )


def _utilisation_desired(policy: Policy, signals: Signals) -> int:
    """Replicas the engines' own gauges call for: a few long prompts can fill a replica's
    KV cache, or leave requests waiting inside it, below the concurrency target."""
    ready = [r for r in signals.replicas if r.phase == "ready"]
    kv = math.ceil(sum(r.kv_cache_usage_perc for r in ready) / policy.kv_cache_target - 1e-9)
    waiting = sum(r.num_requests_waiting for r in ready)
    queued_inside = len(ready) + math.ceil(waiting / policy.target_concurrency) if waiting else 0
    return max(kv, queued_inside)


def _idle(policy: Policy, state: State, t: float) -> bool:
    if policy.scale_to_zero_idle_seconds is None:
        return False
    since = state.last_active_at if state.last_active_at is not None else state.observed_since
    return since is not None and t - since >= policy.scale_to_zero_idle_seconds


def _pick_drain(signals: Signals, count: int) -> tuple[str, ...]:
    if count <= 0:
        return ()
    live = [r for r in signals.replicas if r.phase in ("ready", "starting")]
    live.sort(key=lambda r: (r.in_flight, r.phase != "starting", r.replica_id))
    return tuple(r.replica_id for r in live[:count])


def _explain(policy: Policy, load: _Load, demand: int, now_load: int, panic: bool) -> str:
    parts = [f"window mean needs {load.stable}", f"load now {now_load}"]
    if panic:
        parts.append(f"panic: short window {load.panic_level:.1f} replicas")
    if load.utilisation > load.stable:
        parts.append(f"vllm gauges need {load.utilisation}")
    if demand > policy.max_replicas:
        parts.append(f"demand {demand} beyond max {policy.max_replicas}")
    return ", ".join(parts)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _as_datetime(at: float | None, t: float, now: datetime) -> datetime | None:
    """``at`` (on ``t``'s clock) as a wall-clock time: ``now`` plus how far ahead it is."""
    return None if at is None else now + timedelta(seconds=at - t)
