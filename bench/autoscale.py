"""Autoscaling benchmark: our local policy next to a Knative-KPA-style one, same simulated run.

Measures, on a simulated clock with a 30 s cold start: the time from a 3x load step to the
first scale-up decision and to the new capacity being ready, and the replica-count reversals
under a square-wave load. Target: decision <= 2 s after the step, at most one reversal per
window. The KPA-style policy follows Knative's documented defaults: 60 s stable window, 6 s
panic window, 2 s tick, panic threshold 200 %, max scale-up rate 1000, max scale-down rate 2,
scale-down delay 0 (Knative autoscaler `config-autoscaler` and its decider's panic logic).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloadplane.autoscaling import Policy, Signals
from workloadplane.autoscaling_sim import (
    Controller,
    PolicyController,
    Tick,
    max_reversals_per_window,
    reversals,
    simulate,
)

TARGET = 8.0
COLD_START = 30.0
WINDOW = 60.0


@dataclass
class KpaReference:
    """Knative Pod Autoscaler decider: mean concurrency over the stable and panic windows,
    panic when the panic-window pod count reaches 2x the ready pods, no scale-down in panic,
    panic ends a stable window after the last over-threshold tick."""

    target: float
    min_replicas: int
    max_replicas: int
    stable_window: float = 60.0
    panic_window: float = 6.0
    tick_seconds: float = 2.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    samples: list[tuple[float, float]] = field(default_factory=list)
    panic_time: float | None = None
    max_panic_pods: int = 0

    def observe(self, now: datetime, signals: Signals) -> None:
        t = now.timestamp()
        self.samples.append((t, float(signals.load)))
        self.samples = [s for s in self.samples if s[0] > t - self.stable_window]

    def step(self, now: datetime, signals: Signals) -> tuple[int, tuple[str, ...]]:
        t = now.timestamp()
        ready = max(1, sum(1 for r in signals.replicas if r.phase == "ready"))
        stable = [v for _, v in self.samples]
        panic = [v for s, v in self.samples if s > t - self.panic_window]
        up_limit = math.ceil(self.max_scale_up_rate * ready)
        down_limit = math.floor(ready / self.max_scale_down_rate)
        dspc = min(max(math.ceil(sum(stable) / len(stable) / self.target), down_limit), up_limit)
        dppc = min(max(math.ceil(sum(panic) / len(panic) / self.target), down_limit), up_limit)
        over = dppc / ready >= self.panic_threshold
        if over:
            self.panic_time = t
        elif self.panic_time is not None and self.panic_time + self.stable_window < t:
            self.panic_time, self.max_panic_pods = None, 0
        desired = dspc
        if self.panic_time is not None:
            desired = max(desired, dppc)
            if desired > self.max_panic_pods:
                self.max_panic_pods = desired
            desired = self.max_panic_pods
        return max(self.min_replicas, min(self.max_replicas, desired)), ()


def ours() -> PolicyController:
    # Same knobs as the KPA side; our policy raises a scale-down delay below the window to it.
    policy = Policy(
        min_replicas=1,
        max_replicas=64,
        window_seconds=WINDOW,
        scale_down_delay_seconds=0.0,
        target_concurrency=TARGET,
        scale_to_zero_idle_seconds=None,
    )
    return PolicyController(policy)


def kpa() -> KpaReference:
    return KpaReference(target=TARGET, min_replicas=1, max_replicas=64)


@dataclass(frozen=True)
class StepResult:
    decided_after: float
    ready_after: float


def load_step(make: Callable[[], Controller], base: int, phase: float) -> StepResult:
    """Steady ``base`` concurrent requests on enough replicas, then 3x at t = 120 + phase."""
    controller = make()
    step_at = 120.0 + phase
    replicas = math.ceil(base / TARGET)
    need = math.ceil(3 * base / TARGET)
    ticks = simulate(
        controller,
        lambda t: base if t < step_at else 3 * base,
        duration=300,
        target_concurrency=TARGET,
        cold_start_seconds=COLD_START,
        initial_replicas=replicas,
    )
    after = [tick for tick in ticks if tick.t >= step_at]
    decided = next((x.t for x in after if x.current > replicas), math.inf)
    ready = next((x.t for x in after if x.ready >= need), math.inf)
    return StepResult(decided - step_at, ready - step_at)


def square_wave(make: Callable[[], Controller], low: int, high: int, half: float) -> list[Tick]:
    controller = make()
    return simulate(
        controller,
        lambda t: high if (t // half) % 2 == 0 else low,
        duration=1800,
        target_concurrency=TARGET,
        cold_start_seconds=COLD_START,
        initial_replicas=1,
    )


def main() -> int:
    print(f"autoscale bench: target {TARGET:.0f} req/replica, cold start {COLD_START:.0f} s")
    print("\n3x load step (base load on a right-sized fleet, step between ticks):")
    print(
        f"{'base':>5} {'phase':>6} | {'ours decide':>11} {'ready':>6} | {'kpa decide':>10} {'ready':>6}"
    )
    makers: dict[str, Callable[[], Controller]] = {"ours": ours, "kpa": kpa}
    worst = {"ours": (0.0, 0.0), "kpa": (0.0, 0.0)}
    for base in (25, 28, 32, 60, 120):
        for phase in (0.1, 0.5, 0.9):
            a, b = load_step(makers["ours"], base, phase), load_step(makers["kpa"], base, phase)
            print(
                f"{base:>5} {phase:>6.1f} | {a.decided_after:>10.1f}s {a.ready_after:>5.1f}s"
                f" | {b.decided_after:>9.1f}s {b.ready_after:>5.1f}s"
            )
            for name, r in (("ours", a), ("kpa", b)):
                d, rd = worst[name]
                worst[name] = (max(d, r.decided_after), max(rd, r.ready_after))

    print("\nsquare wave, 30 min (low/high concurrent requests, half-period):")
    print(
        f"{'wave':>16} | {'ours rev':>8} {'max/win':>7} {'mean rep':>8} {'queued':>6}"
        f" | {'kpa rev':>7} {'max/win':>7} {'mean rep':>8} {'queued':>6}"
    )
    flaps = {"ours": 0, "kpa": 0}
    for low, high, half in ((8, 40, 5.0), (8, 40, 15.0), (0, 64, 20.0), (16, 48, 29.0)):
        row = []
        for name, make in makers.items():
            ticks = square_wave(make, low, high, half)
            flips = reversals(ticks)
            per_window = max_reversals_per_window(flips, WINDOW)
            flaps[name] = max(flaps[name], per_window)
            mean = sum(x.current for x in ticks) / len(ticks)
            queued = sum(max(0.0, x.load - x.ready * TARGET) for x in ticks) / len(ticks)
            row.append(f"{len(flips):>8} {per_window:>7} {mean:>8.1f} {queued:>6.1f}")
        print(f"{f'{low}/{high} {half:.0f}s':>16} | {row[0]} | {row[1]}")

    ok = worst["ours"][0] <= 2.0 and flaps["ours"] <= 1
    print(
        f"\nHEADLINE autoscale: scale-up decided <= {worst['ours'][0]:.1f} s after a 3x step, "
        f"capacity ready <= {worst['ours'][1]:.1f} s, max {flaps['ours']} reversal/window | "
        f"peer KPA-style: {worst['kpa'][0]:.1f} s, {worst['kpa'][1]:.1f} s, "
        f"max {flaps['kpa']} reversals/window | target: decision <= 2 s, <= 1 reversal/window | "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
