"""The agent's autoscaler around the pure policy (``autoscaling.decide``).

Per deployment and tick: the router's load (in flight per replica, queued) and the replicas'
vLLM gauges in, a ``Decision`` out, the policy's ``State`` kept here between ticks. It only
decides; the agent carries decisions out (drains, ``wanted``). It never reads the clock for a
decision: ``now`` is passed in. The gauges (``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``) are scraped in the background, so a slow replica never delays
a decision; gauges older than three scrape intervals are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from prometheus_client import Counter

from controlplane.contracts import DeploymentDesired, ReplicaState, ReplicaStatus, ScheduleWindow
from workloadplane.autoscaling import (
    Decision,
    Policy,
    ReplicaSignal,
    ScaleAction,
    ScheduleRule,
    Signals,
    State,
    decide,
)
from workloadplane.demand import ReportedDemand, reported_demand
from workloadplane.router.core import Backend, Router, concurrency_limit
from workloadplane.router.upstream import UpstreamError

log = logging.getLogger(__name__)

DECISION_FAILURES = Counter(
    "gpufleet_agent_autoscale_failures_total",
    "Autoscaling decisions for one deployment that raised (it holds; the others go on)",
)
HELD_LOAD_UNKNOWN = Counter(
    "gpufleet_agent_autoscale_held_total",
    "Autoscaling decisions not taken because the router's load report was stale",
)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """A decision that changed something: what the agent logs and keeps for inspection."""

    time: datetime
    deployment: str
    action: ScaleAction
    from_replicas: int
    to_replicas: int
    drain: tuple[str, ...]
    reason: str
    panic: bool
    demand: int


@dataclass(frozen=True, slots=True)
class Gauges:
    """A replica's vLLM gauges, summed (waiting) or averaged (KV cache) over its engines."""

    num_requests_waiting: float = 0.0
    kv_cache_usage_perc: float = 0.0


def policy_for(
    deployment: DeploymentDesired,
    target_concurrency: float,
    schedule: tuple[ScheduleRule, ...] = (),
) -> Policy:
    """The policy's knobs from the desired state: min/max from the quota, the rest from the
    deployment's autoscaling spec. ``target_concurrency`` is the router's per-replica limit."""
    spec = deployment.autoscaling
    return Policy(
        min_replicas=deployment.quota.min,
        max_replicas=deployment.quota.max,
        window_seconds=spec.window_seconds,
        scale_down_delay_seconds=spec.scale_down_delay_seconds,
        target_concurrency=target_concurrency,
        scale_to_zero_idle_seconds=spec.scale_to_zero_idle_seconds,
        schedule=schedule,
    )


def schedule_rules(windows: Sequence[ScheduleWindow]) -> tuple[ScheduleRule, ...]:
    """The spec's schedule as policy rules; a window with a bad time or zone is skipped."""
    rules = []
    for w in windows:
        try:
            tz = ZoneInfo(w.timezone)
            start, end = time.fromisoformat(w.start), time.fromisoformat(w.end)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            log.warning(
                "schedule window %s ignored (%s): use HH:MM times and an IANA time "
                "zone such as Europe/Paris",
                w.model_dump(),
                exc,
            )
            continue
        rules.append(ScheduleRule(frozenset(w.days), start, end, w.min_replicas, tz))
    return tuple(rules)


def parse_gauges(text: str) -> Gauges:
    """``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` from a /metrics page.
    A value that is not a finite number at least 0 (``NaN``, ``+Inf``, a negative one) is
    left out: the policy divides and rounds these, and one bad replica must not make a
    decision impossible. KV-cache usage is a fraction: clamped to [0, 1]."""
    waiting, kv = 0.0, []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, rest = line.partition("{")
        if rest:
            rest = rest.rpartition("}")[2]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            continue
        if name == "vllm:num_requests_waiting":
            waiting += value
        elif name == "vllm:kv_cache_usage_perc":
            kv.append(min(value, 1.0))
    if not math.isfinite(waiting):  # finite values whose sum overflowed
        waiting = 0.0
    return Gauges(waiting, sum(kv) / len(kv) if kv else 0.0)


class Autoscaler:
    """Decisions per deployment, with the policy's state, the last decision and the events."""

    def __init__(
        self,
        router: Router,
        clock: Callable[[], datetime],
        *,
        history: int = 200,
        steady: Callable[[], float] | None = None,
    ) -> None:
        self.router = router
        self.clock = clock
        self.steady = steady
        """The clock windows, delays and back-off are measured on (``time.monotonic`` in
        the agent process); None: ``clock``'s timestamps (tests drive one clock)."""
        self.states: dict[str, State] = {}
        self.last: dict[str, Decision] = {}
        self.events: deque[ScaleEvent] = deque(maxlen=history)
        self.gauges: dict[str, tuple[datetime, Gauges]] = {}
        self.scrape_interval = 1.0
        self._rules: dict[str, tuple[list[ScheduleWindow], tuple[ScheduleRule, ...]]] = {}
        self._phases: dict[str, ReplicaState] = {}
        self._beyond: dict[str, int] = {}
        self._reported: dict[str, ReportedDemand] = {}
        self._max: dict[str, int] = {}
        self.confirm: dict[str, float] = {}
        """deployment → seconds after its last decision to decide again (Decision.confirm_in)"""
        self._failing: set[str] = set()  # deployments whose last decision raised
        self._load_unknown = False  # the router's load report is stale (logged once)

    # --- waking -----------------------------------------------------------------------------
    async def woken(self, timeout: float) -> set[str]:
        """Deployments the router queued a request for while they had no ready or starting
        replica; waits up to ``timeout`` seconds for one if none is."""
        return await self.router.scale_from_zero.take(timeout)

    async def run(
        self, interval: float, tick: Callable[[set[str] | None], Awaitable[None]]
    ) -> None:
        """Call ``tick(None)`` (every deployment) every ``interval`` seconds on a fixed
        cadence, and ``tick(names)`` in between for the deployments the router woke (at once)
        and those whose last decision asked to be confirmed sooner (``confirm``); scrape the
        gauges meanwhile."""
        loop = asyncio.get_running_loop()
        scraper = asyncio.create_task(self.scrape_loop(interval), name="autoscaler-gauges")
        next_tick = loop.time()
        due: dict[str, float] = {}  # deployment → loop time of its early decision
        try:
            while True:
                until = min([next_tick, *due.values()])
                only: set[str] | None = await self.woken(until - loop.time())
                now = loop.time()
                if now >= next_tick:
                    only = None
                    next_tick += interval
                    if next_tick <= now:  # fell behind: no burst of catch-up ticks
                        next_tick = now + interval
                else:
                    only |= {name for name, at in due.items() if at <= now}
                due = {n: at for n, at in due.items() if only is not None and n not in only}
                self.confirm.clear()
                try:
                    await tick(only)
                except Exception:
                    log.exception("autoscale pass failed; retrying")
                now = loop.time()
                due |= {name: now + after for name, after in self.confirm.items()}
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper

    # --- deciding ---------------------------------------------------------------------------
    def decide(
        self,
        deployment: DeploymentDesired,
        replicas: Sequence[ReplicaStatus],
        now: datetime,
        leaving: Collection[str] = (),
    ) -> Decision | None:
        """Run the policy for ``deployment`` at ``now``. ``leaving``: replicas reconcile is
        replacing (see ``signals``). None (nothing to carry out, the deployment holds) when
        its knobs are invalid; when the router's load is not known (its report is stale: no
        decision and no sample, where a sample of zero load could scale it to zero); or
        when deciding raised (logged once until it succeeds again, and counted): one
        deployment's failure never stops the others' decisions."""
        name = deployment.name
        target = concurrency_limit(deployment, self.router.config)
        try:
            policy = policy_for(deployment, target, self._schedule(deployment))
        except ValueError as exc:
            log.warning("autoscaling of %s skipped: %s", name, exc)
            return None
        try:
            decision = self._decide(deployment, policy, replicas, now, leaving)
        except Exception:
            DECISION_FAILURES.inc()
            if name not in self._failing:
                log.exception(
                    "autoscaling of %s failed; it holds at its current count while the other "
                    "deployments are decided (logged once until it succeeds again)",
                    name,
                )
            self._failing.add(name)
            return None
        if decision is not None and name in self._failing:
            self._failing.discard(name)
            log.info("autoscaling of %s decides again", name)
        return decision

    def _decide(
        self,
        deployment: DeploymentDesired,
        policy: Policy,
        replicas: Sequence[ReplicaStatus],
        now: datetime,
        leaving: Collection[str],
    ) -> Decision | None:
        name = deployment.name
        signals = self.signals(deployment, replicas, now, leaving)
        if signals is None:
            HELD_LOAD_UNKNOWN.inc()
            if not self._load_unknown:
                self._load_unknown = True
                log.warning(
                    "the router's load report is stale (the router does not answer "
                    "/internal/load): autoscaling holds every deployment, taking no "
                    "decision and no sample, until it answers again"
                )
            return None
        if self._load_unknown:
            self._load_unknown = False
            log.info("the router's load is known again: autoscaling resumes")
        previous = self.last.get(name)
        t = self.steady() if self.steady is not None else None
        decision, self.states[name] = decide(
            policy, self.states.get(name, State()), signals, now, t
        )
        self.last[name] = decision
        if decision.confirm_in is not None:
            self.confirm[name] = decision.confirm_in
        self._max[name] = policy.max_replicas
        self._reported[name] = reported_demand(
            self._reported.get(name, ReportedDemand()),
            max(decision.unconstrained_desired, decision.desired_replicas),
            now.timestamp(),
            policy.effective_scale_down_delay,
            policy.window_seconds,
            urgent=decision.panic,
        )
        if _changes_something(decision, previous):
            self.events.append(
                ScaleEvent(
                    now,
                    name,
                    decision.action,
                    decision.current_replicas,
                    decision.desired_replicas,
                    decision.drain,
                    decision.reason,
                    decision.panic,
                    decision.unconstrained_desired,
                )
            )
            log.info("autoscaler %s: %s", name, decision.reason)
        return decision

    def signals(
        self,
        deployment: DeploymentDesired,
        replicas: Sequence[ReplicaStatus],
        now: datetime,
        leaving: Collection[str] = (),
    ) -> Signals | None:
        """Replicas of an older revision, and the ``leaving`` ones (on a draining instance or
        a pool no longer used), count as draining: reconcile replaces them, so they are not
        capacity (their requests are still load), and a scale-down never picks them instead
        of a replica that stays. None when the router's load is not known (``Router.fresh``)."""
        mine = [r for r in replicas if r.deployment == deployment.name]
        in_flight: dict[str, int] = {}
        for r in mine:
            count = self.router.replica_in_flight(r.replica_id)
            if count is None:
                return None
            in_flight[r.replica_id] = count
        _, queued = self.router.load(deployment.name)
        if not self.router.fresh:  # asked after reading: fresh now, fresh all along
            return None
        fresh_after = now.timestamp() - 3 * self.scrape_interval
        out, failed_starts = [], 0
        for r in mine:
            before = self._phases.get(r.replica_id)
            self._phases[r.replica_id] = r.state
            if r.state == "failed":
                failed_starts += before in (None, "starting")
                continue
            current = r.revision == deployment.spec.revision and r.replica_id not in leaving
            phase = r.state if current else "draining"
            at, gauges = self.gauges.get(r.replica_id, (now, Gauges()))
            if phase != "ready" or at.timestamp() < fresh_after:
                gauges = Gauges()
            out.append(
                ReplicaSignal(
                    r.replica_id,
                    phase,
                    in_flight[r.replica_id],
                    gauges.num_requests_waiting,
                    gauges.kv_cache_usage_perc,
                )
            )
        return Signals(tuple(out), queued, failed_starts)

    def _schedule(self, deployment: DeploymentDesired) -> tuple[ScheduleRule, ...]:
        windows = deployment.autoscaling.schedule
        cached = self._rules.get(deployment.name)
        if cached is None or cached[0] != windows:
            cached = self._rules[deployment.name] = (windows, schedule_rules(windows))
        return cached[1]

    def demand(self, name: str) -> int | None:
        """Replicas to report upward: the unclamped demand (may exceed max), never below what
        the policy keeps, raised at once by 2+ (or in panic), by one after the window, and
        lowered only after the scale-down delay (``workloadplane.demand``)."""
        reported = self._reported.get(name)
        return None if reported is None else reported.value

    def newly_beyond_max(self, name: str) -> bool:
        """True once each time the reported demand beyond max rises (to report it as a fact):
        with the report's hysteresis, a demand flickering across max is one fact, not one
        per flicker (each one asks the control plane for a re-plan)."""
        demand = self.demand(name)
        beyond = max(0, demand - self._max.get(name, demand)) if demand is not None else 0
        before = self._beyond.get(name, 0)
        self._beyond[name] = beyond
        return beyond > before

    def forget(self, keep: Collection[str], replicas: Collection[str]) -> None:
        """Drop what is kept for deployments no longer desired and replicas gone."""
        for table in (
            self.states,
            self.last,
            self._rules,
            self._beyond,
            self._reported,
            self._max,
        ):
            for name in [n for n in table if n not in keep]:
                del table[name]
        self._failing &= set(keep)
        for table in (self._phases, self.gauges):
            for rid in [r for r in table if r not in replicas]:
                del table[rid]

    # --- gauges -----------------------------------------------------------------------------
    async def scrape_once(self) -> None:
        backends = [b for b in self.router.backends.values() if b.routable]
        texts = await asyncio.gather(*(_fetch(b, self.scrape_interval / 2) for b in backends))
        now = self.clock()
        for backend, text in zip(backends, texts, strict=True):
            if text is not None:
                self.gauges[backend.replica_id] = (now, parse_gauges(text))

    async def scrape_loop(self, interval: float) -> None:
        self.scrape_interval = interval
        while True:
            try:
                await self.scrape_once()
            except Exception:
                log.exception("scraping the replicas' gauges failed; retrying")
            await asyncio.sleep(interval)


def _changes_something(decision: Decision, previous: Decision | None) -> bool:
    if decision.action is not ScaleAction.HOLD:
        return True
    backing_off = decision.desired_replicas != decision.current_replicas
    return backing_off and (previous is None or previous.failed_starts != decision.failed_starts)


async def _fetch(backend: Backend, timeout: float) -> str | None:
    try:
        resp = await backend.pool.request(
            "GET", "/metrics", head_timeout=timeout, connect_timeout=timeout
        )
        body = await resp.read_within(timeout)  # a stalled body closes its connection
    except (UpstreamError, TimeoutError):
        return None
    return body.decode(errors="replace") if resp.status == 200 else None
