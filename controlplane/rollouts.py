"""Rollout decisions, pure: where a canary or blue-green rollout goes next, from what the
two revisions measured over the same window. No I/O, no clock: callers pass ``now``.

Issue 18's core (docs/rollouts.md). `services/rollouts.py` carries the decisions out (the
record, the tick, the commands); `lane_entries` below is how a running canary shows in one
cluster's desired state.

Canary, step by step (default 5 % → 25 % → 50 % → 100 %):

1. **Pre-scale.** Before traffic moves to a step's share, the new revision must have the
   ready replicas that share needs (``replicas_for``): users do not wait for the autoscaler.
2. **Hold** ``hold_s`` at the step; then the **gates** compare the new revision with the
   stable one over the same window: error rate (5xx and engine errors), p99 TTFT and p99
   end-to-end latency. A gate needs ``min_requests`` on each side before it may pass; a
   failed gate rolls back at once (a clear failure needs no minimum sample beyond it).
3. Passing the last step **promotes**: the stable revision is drained.

The shares split the deployment's replicas (``split``): the stable revision shrinks as the
canary grows, so a canary never doubles the GPUs (blue-green does, by design, for its
keep window). Commands — pause, resume, promote, rollback — are transitions too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from controlplane.contracts import (
    LATENCY_BUCKETS_S,
    DeploymentDesired,
    OutcomeCounters,
    PoolQuota,
    ReplicaQuota,
    RevisionSpec,
)


class Phase(StrEnum):
    SCALING = "scaling"  # waiting for the new revision's ready replicas for the next share
    HOLDING = "holding"  # at a step, gathering the window the gates judge
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


DONE = frozenset({Phase.PROMOTED, Phase.ROLLED_BACK})


@dataclass(frozen=True)
class Gates:
    min_requests: int = 100
    """On each side, before a gate may pass (it may fail earlier)."""
    max_error_rate_increase: float = 0.01
    """The new revision's error rate may exceed the stable one's by this much (absolute)."""
    max_p99_ttft_ratio: float = 1.5
    max_p99_e2e_ratio: float = 1.5


@dataclass(frozen=True)
class CanaryPolicy:
    steps: tuple[float, ...] = (0.05, 0.25, 0.5, 1.0)
    hold_s: float = 300.0
    gates: Gates = Gates()


@dataclass(frozen=True)
class Window:
    """One revision's traffic over the window the gates judge."""

    requests: int
    errors: int
    p99_ttft_s: float
    p99_e2e_s: float

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def quantile_of(buckets: Sequence[int], q: float) -> float:
    """The ``q`` quantile of a bucketed latency (``LATENCY_BUCKETS_S`` bounds, then the
    rest), as the upper bound of the bucket it falls in; the rest count as twice the last
    bound. 0.0 when the buckets hold nothing."""
    total = sum(buckets)
    if total <= 0:
        return 0.0
    need, seen = q * total, 0
    for i, n in enumerate(buckets):
        seen += n
        if seen >= need:
            return LATENCY_BUCKETS_S[i] if i < len(LATENCY_BUCKETS_S) else 2 * LATENCY_BUCKETS_S[-1]
    return 2 * LATENCY_BUCKETS_S[-1]


def outcomes_delta(before: OutcomeCounters | None, after: OutcomeCounters) -> OutcomeCounters:
    """What happened between two reports of one router (a new ``since``: it restarted, so
    ``after`` counts from zero and is the whole delta)."""
    if before is None or before.since != after.since:
        return after

    def minus(a: list[int], b: list[int]) -> list[int]:
        width = max(len(a), len(b))
        a, b = a + [0] * (width - len(a)), b + [0] * (width - len(b))
        return [max(0, x - y) for x, y in zip(a, b, strict=True)]

    return OutcomeCounters(
        since=after.since,
        requests=max(0, after.requests - before.requests),
        errors=max(0, after.errors - before.errors),
        ttft_buckets=minus(after.ttft_buckets, before.ttft_buckets),
        e2e_buckets=minus(after.e2e_buckets, before.e2e_buckets),
    )


def window_of(deltas: Sequence[OutcomeCounters]) -> Window:
    """One revision's window from its deltas on every plane (bucket counts add up)."""

    def added(lists: list[list[int]]) -> list[int]:
        width = max((len(x) for x in lists), default=0)
        return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]

    return Window(
        requests=sum(d.requests for d in deltas),
        errors=sum(d.errors for d in deltas),
        p99_ttft_s=quantile_of(added([d.ttft_buckets for d in deltas]), 0.99),
        p99_e2e_s=quantile_of(added([d.e2e_buckets for d in deltas]), 0.99),
    )


@dataclass(frozen=True)
class Verdict:
    passed: bool | None
    """True: every gate passed; False: one failed (``reason`` says which); None: not enough
    traffic yet to pass."""
    reason: str


def judge(new: Window, stable: Window, gates: Gates) -> Verdict:
    """The gates on the same window. A failure is reported as soon as it is certain beyond
    noise the minimum sample would remove: the new revision's errors alone exceed what the
    gate allows for the whole minimum sample."""
    allowed = stable.error_rate + gates.max_error_rate_increase
    if new.requests >= gates.min_requests and new.error_rate > allowed:
        return Verdict(False, f"error rate {new.error_rate:.1%} > {allowed:.1%} (stable + "
                       f"{gates.max_error_rate_increase:.1%})")  # fmt: skip
    if new.errors > allowed * max(new.requests, gates.min_requests):
        return Verdict(False, f"{new.errors} errors in {new.requests} requests: over "
                       f"{allowed:.1%} whatever the rest do")  # fmt: skip
    if new.requests < gates.min_requests or stable.requests < gates.min_requests:
        return Verdict(None, f"waiting for {gates.min_requests} requests on each revision "
                       f"({new.requests} new, {stable.requests} stable)")  # fmt: skip
    for name, mine, theirs, ratio in (
        ("p99 TTFT", new.p99_ttft_s, stable.p99_ttft_s, gates.max_p99_ttft_ratio),
        ("p99 end-to-end", new.p99_e2e_s, stable.p99_e2e_s, gates.max_p99_e2e_ratio),
    ):
        if theirs > 0 and mine > theirs * ratio:
            return Verdict(False, f"{name} {mine:.3f}s > {ratio:g} x stable {theirs:.3f}s")
    return Verdict(True, "every gate passed")


@dataclass(frozen=True)
class Rollout:
    step: int
    """Index into the policy's steps of the share the new revision has (or is scaling to)."""
    phase: Phase
    since: datetime
    """When the current phase began (a hold counts from here)."""
    reason: str = ""
    paused_from: Phase | None = None

    @property
    def done(self) -> bool:
        return self.phase in DONE


def start(now: datetime) -> Rollout:
    return Rollout(0, Phase.SCALING, now, "pre-scaling the new revision for the first step")


def share(r: Rollout, policy: CanaryPolicy) -> float:
    """The new revision's share of traffic now: 0 until its first step is ready and held."""
    if r.phase is Phase.PROMOTED:
        return 1.0
    if r.phase is Phase.ROLLED_BACK:
        return 0.0
    phase = r.paused_from if r.phase is Phase.PAUSED else r.phase
    at = r.step if phase is Phase.HOLDING else r.step - 1  # scaling: the last step's share
    return policy.steps[at] if at >= 0 else 0.0


def split(total: int, new_share: float) -> tuple[int, int]:
    """(new, stable) replicas for ``total`` when the new revision takes ``new_share``: each
    side rounds up so that neither is short (at most one replica more than ``total``), and
    a side with no share gets none."""
    if new_share <= 0:
        return 0, total
    if new_share >= 1:
        return total, 0
    return math.ceil(total * new_share), math.ceil(total * (1 - new_share))


def replicas_for(total: int, r: Rollout, policy: CanaryPolicy) -> int:
    """Ready replicas the new revision needs before traffic moves to its next share."""
    return split(total, policy.steps[min(r.step, len(policy.steps) - 1)])[0]


def decide(
    r: Rollout,
    policy: CanaryPolicy,
    now: datetime,
    new_ready: int,
    total: int,
    new: Window,
    stable: Window,
) -> Rollout:
    """One look at a running canary: scale, hold, advance, promote or roll back."""
    if r.done or r.phase is Phase.PAUSED:
        return r
    if r.phase is Phase.SCALING:
        need = replicas_for(total, r, policy)
        if new_ready < need:
            return replace(r, reason=f"waiting for {need} ready replicas of the new revision "
                           f"({new_ready} now) before {policy.steps[r.step]:.0%}")  # fmt: skip
        return Rollout(r.step, Phase.HOLDING, now, f"at {policy.steps[r.step]:.0%}")
    verdict = judge(new, stable, policy.gates)
    if verdict.passed is False:
        return Rollout(r.step, Phase.ROLLED_BACK, now, f"gate failed: {verdict.reason}")
    if (now - r.since).total_seconds() < policy.hold_s or verdict.passed is None:
        return replace(r, reason=verdict.reason if verdict.passed is None else r.reason)
    if r.step + 1 >= len(policy.steps):
        return Rollout(r.step, Phase.PROMOTED, now, "the last step passed its gates")
    return Rollout(r.step + 1, Phase.SCALING, now, f"{policy.steps[r.step]:.0%} passed")


def pause(r: Rollout, now: datetime) -> Rollout:
    if r.done or r.phase is Phase.PAUSED:
        return r
    return Rollout(r.step, Phase.PAUSED, now, "paused by an operator", paused_from=r.phase)


def resume(r: Rollout, now: datetime) -> Rollout:
    """Back to where it paused; a hold starts again (the window before the pause is old)."""
    if r.phase is not Phase.PAUSED or r.paused_from is None:
        return r
    return Rollout(r.step, r.paused_from, now, "resumed by an operator")


def promote(r: Rollout, now: datetime) -> Rollout:
    return r if r.done else Rollout(r.step, Phase.PROMOTED, now, "promoted by an operator")


def rollback(r: Rollout, now: datetime) -> Rollout:
    return r if r.done else Rollout(r.step, Phase.ROLLED_BACK, now, "rolled back by an operator")


# --- rollout lanes in the desired state ----------------------------------------------------

LANE = re.compile(r"^(?P<deployment>.+)--r(?P<revision>[0-9]+)$")


def lane_name(deployment: str, revision: int) -> str:
    """The desired-state entry that runs ``revision`` of ``deployment`` beside its stable
    revision during a canary (its replicas serve the model name ``deployment``)."""
    return f"{deployment}--r{revision}"


def lane_of(entry: str) -> tuple[str, int] | None:
    """(deployment, revision) when ``entry`` names a rollout lane, else None (deployment
    names never look like a lane: `specs.DeploymentSpec` refuses them)."""
    found = LANE.match(entry)
    return (found["deployment"], int(found["revision"])) if found else None


def _filled(quotas: Sequence[PoolQuota], n: int) -> list[PoolQuota]:
    """``n`` replicas over the pools in their order of preference, each up to its max."""
    out, left = [], n
    for q in quotas:
        take = min(left, q.max)
        out.append(PoolQuota(pool=q.pool, min=take, max=take))
        left -= take
    return out


def lane_entries(
    entry: DeploymentDesired,
    here: int,
    stable: RevisionSpec,
    r: Rollout,
    policy: CanaryPolicy,
    lane: str,
) -> list[DeploymentDesired]:
    """A deployment's entry on one cluster (``here``: the replicas placed there) during a
    canary: the stable entry (``stable``'s spec, its quota scaled to the stable share) and
    the lane (``entry``'s spec, the new revision, at exactly its replicas: pre-scaled to the
    next step's while scaling, so traffic never moves to replicas that are not ready). Done,
    or nothing placed here: the entry as it is (a finished lane is retired by name)."""
    if r.done or here <= 0:
        return [entry]
    now_share = share(r, policy)
    phase = r.paused_from if r.phase is Phase.PAUSED else r.phase
    lane_n = replicas_for(here, r, policy) if phase is Phase.SCALING else split(here, now_share)[0]

    def stable_part(n: int) -> int:
        return split(n, now_share)[1]

    kept = entry.model_copy(
        update={
            "spec": stable,
            "quota": ReplicaQuota(
                min=stable_part(entry.quota.min), max=stable_part(entry.quota.max)
            ),
            "pool_quotas": [
                PoolQuota(pool=q.pool, min=stable_part(q.min), max=stable_part(q.max))
                for q in entry.pool_quotas
            ],
        }
    )
    auto = entry.autoscaling.model_copy(update={"scale_to_zero_idle_seconds": None, "schedule": []})
    added = entry.model_copy(
        update={
            "name": lane,
            "serves": entry.name,
            "traffic_share": now_share,
            "quota": ReplicaQuota(min=lane_n, max=lane_n),
            "pool_quotas": _filled(entry.pool_quotas, lane_n),
            "hold_leaving": 0,
            "autoscaling": auto,
        }
    )
    return [kept, added]
