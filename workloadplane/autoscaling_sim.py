"""Simulated clock for autoscaling policies: a load trace in, the replica history out.

Pure and deterministic; used by the property tests and ``bench/autoscale.py``. Load is the
number of concurrent requests; ready replicas take up to the concurrency target each and the
rest wait in the router queue. A replica becomes ready ``cold_start_seconds`` after it is
started and leaves at once when drained (in-flight requests move to the queue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from workloadplane.autoscaling import (
    Decision,
    Policy,
    ReplicaSignal,
    ScaleAction,
    Signals,
    State,
    decide,
)

EPOCH = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)  # a Monday


class Controller(Protocol):
    """One autoscaler under test: called every ``tick_seconds`` with the signals."""

    tick_seconds: float

    def observe(self, now: datetime, signals: Signals) -> None:
        """See the signals of every sample, tick or not (metrics scraping)."""
        ...

    def step(self, now: datetime, signals: Signals) -> tuple[int, tuple[str, ...]]:
        """Return (desired replicas, replicas to remove first)."""
        ...

    def next_step_in(self) -> float | None:
        """Seconds from the last step to the next when sooner than the tick; None: the tick."""
        ...


@dataclass
class PolicyController:
    """Adapter running :func:`decide` and keeping its state and decisions."""

    policy: Policy
    tick_seconds: float = 1.0
    state: State = field(default_factory=State)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)
    confirm_in: float | None = None  # as the agent's loop does (Autoscaler.run)

    def observe(self, now: datetime, signals: Signals) -> None:
        pass  # the agent samples on its own tick

    def next_step_in(self) -> float | None:
        return self.confirm_in

    def step(self, now: datetime, signals: Signals) -> tuple[int, tuple[str, ...]]:
        decision, self.state = decide(self.policy, self.state, signals, now)
        self.decisions.append(((now - EPOCH).total_seconds(), decision))
        self.confirm_in = decision.confirm_in
        if decision.action == ScaleAction.HOLD:
            return decision.current_replicas, ()
        return decision.desired_replicas, decision.drain


@dataclass(frozen=True, slots=True)
class Tick:
    t: float  # seconds since the start
    load: int
    desired: int
    current: int  # ready + starting
    ready: int


@dataclass
class _Replica:
    replica_id: str
    ready_at: float


def simulate(
    controller: Controller,
    load: Callable[[float], float],
    *,
    duration: float,
    target_concurrency: float,
    cold_start_seconds: float = 30.0,
    initial_replicas: int = 0,
    sample_seconds: float = 1.0,
) -> list[Tick]:
    """Run ``controller`` over ``load(t)`` for ``duration`` seconds of simulated time."""
    replicas = [_Replica(f"r{i}", 0.0) for i in range(initial_replicas)]
    serial = initial_replicas
    ticks: list[Tick] = []
    steps = round(duration / sample_seconds)
    every = max(1, round(controller.tick_seconds / sample_seconds))
    early: float | None = None  # the time of a step the controller asked for between ticks
    for i in range(steps + 1):
        t = i * sample_seconds
        demand = round(load(t))
        signals = _signals(replicas, t, demand, target_concurrency)
        desired = len(replicas)
        controller.observe(EPOCH + timedelta(seconds=t), signals)
        if i % every == 0 or (early is not None and t >= early - 1e-9):
            desired, drain = controller.step(EPOCH + timedelta(seconds=t), signals)
            sooner = controller.next_step_in()
            early = None if sooner is None else t + sooner
            if desired < len(replicas):
                replicas = _remove(replicas, t, len(replicas) - desired, drain)
            while desired > len(replicas):
                replicas.append(_Replica(f"r{serial}", t + cold_start_seconds))
                serial += 1
        ready = sum(1 for r in replicas if r.ready_at <= t)
        ticks.append(Tick(t, demand, desired, len(replicas), ready))
    return ticks


def _signals(replicas: list[_Replica], t: float, demand: int, target: float) -> Signals:
    left = demand
    out: list[ReplicaSignal] = []
    for r in replicas:
        if r.ready_at <= t:
            take = min(left, int(target))
            left -= take
            out.append(ReplicaSignal(r.replica_id, "ready", in_flight=take))
        else:
            out.append(ReplicaSignal(r.replica_id, "starting"))
    return Signals(replicas=tuple(out), queued=left)


def _remove(
    replicas: list[_Replica], t: float, count: int, drain: tuple[str, ...]
) -> list[_Replica]:
    chosen = [r for r in replicas if r.replica_id in drain][:count]
    # Controllers that name no replicas lose the newest (starting ones first) instead.
    rest = [r for r in reversed(replicas) if r not in chosen]
    chosen += rest[: count - len(chosen)]
    return [r for r in replicas if r not in chosen]


def reversals(ticks: list[Tick], since: float = 0.0) -> list[float]:
    """Times at which the replica count changed direction (up then down, or down then up)."""
    out: list[float] = []
    direction = 0
    previous = None
    for tick in ticks:
        if previous is not None and tick.t >= since and tick.current != previous:
            step = 1 if tick.current > previous else -1
            if direction and step != direction:
                out.append(tick.t)
            direction = step
        previous = tick.current
    return out


def max_reversals_per_window(times: list[float], window: float) -> int:
    """Most reversals that fall inside any interval of ``window`` seconds."""
    best = 0
    for i, start in enumerate(times):
        best = max(best, sum(1 for t in times[i:] if t < start + window))
    return best
