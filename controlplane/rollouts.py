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

Blue-green (a policy with ``keep_s``; its one step is 100 %): the new revision is brought up
at full size beside the stable one (**scaling**, no traffic), then takes all the traffic at
once (**keeping**) while the stable one stays at full size for ``keep_s``, so a rollback is
instant; the gates watch the new revision against what the stable one served before the
switch and roll back on a failure; the keep window over, it is **promoted**.

A step with next to no traffic (**idle**: fewer than ``min_requests`` on both revisions
together over the hold) passes when its hold is over: nobody can be harmed by moving on,
and holding would keep a quiet deployment at its first step for ever.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from controlplane.contracts import (
    LATENCY_BUCKETS_S,
    AutoscalingPolicy,
    DeploymentDesired,
    OutcomeCounters,
    PoolQuota,
    ReplicaQuota,
    RevisionSpec,
)


class Phase(StrEnum):
    SCALING = "scaling"  # waiting for the new revision's ready replicas for the next share
    HOLDING = "holding"  # at a step, gathering the window the gates judge
    KEEPING = "keeping"  # blue-green: all traffic on the new revision, the stable one kept
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
    keep_s: float | None = None
    """Blue-green (``steps`` is then ``(1.0,)``): how long the stable revision stays at full
    size after the switch. None: a canary."""

    @property
    def blue_green(self) -> bool:
        return self.keep_s is not None


def blue_green(keep_s: float, gates: Gates = Gates()) -> CanaryPolicy:
    """The policy of a blue-green rollout: one step, all the traffic, kept ``keep_s``."""
    return CanaryPolicy(steps=(1.0,), hold_s=0.0, gates=gates, keep_s=keep_s)


@dataclass(frozen=True)
class Window:
    """One revision's traffic over the window the gates judge."""

    requests: int
    errors: int
    p99_ttft_s: float
    p99_e2e_s: float
    ttft_buckets: tuple[int, ...] = ()
    """The summed latency buckets the p99s come from (``LATENCY_BUCKETS_S``); empty for a
    window stored as JSON (blue-green's baseline) or built by hand."""
    e2e_buckets: tuple[int, ...] = ()

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

    ttft, e2e = added([d.ttft_buckets for d in deltas]), added([d.e2e_buckets for d in deltas])
    return Window(
        requests=sum(d.requests for d in deltas),
        errors=sum(d.errors for d in deltas),
        p99_ttft_s=quantile_of(ttft, 0.99),
        p99_e2e_s=quantile_of(e2e, 0.99),
        ttft_buckets=tuple(ttft),
        e2e_buckets=tuple(e2e),
    )


TAIL = 0.01
"""The share of requests a p99 leaves above it."""
FALSE_ROLLBACK = 0.001
"""The most a latency gate may fail a revision whose p99 is exactly at its bound, by chance."""


def slower_than(buckets: Sequence[int], bound_s: float) -> int:
    """Requests certainly slower than ``bound_s``: those in buckets whose lower edge is at or
    above it (a bucket holds the latencies above the previous bound up to its own)."""
    lows = (0.0, *LATENCY_BUCKETS_S)  # a report may carry fewer buckets than there are
    return sum(n for low, n in zip(lows, buckets, strict=False) if low >= bound_s)


def beyond_chance(slow: int, n: int, tail: float = TAIL) -> bool:
    """Whether ``slow`` of ``n`` requests over a bound that at most ``tail`` of them cross
    (on average) is more than chance explains: P(Binomial(n, tail) >= slow) <
    FALSE_ROLLBACK. Under it a small sample's p99, which is its slowest request or two,
    does not decide: 1 slow request of 30 is chance, 4 are not; of 1,000, 22 are not."""
    if slow <= n * tail or n <= 0:
        return False
    log_p, log_q = math.log(tail), math.log1p(-tail)
    top = math.lgamma(n + 1)
    total = 0.0
    for i in range(slow, n + 1):  # the upper tail; its terms fall from the first on
        term = math.exp(top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p
                        + (n - i) * log_q)  # fmt: skip
        total += term
        if total >= FALSE_ROLLBACK:
            return False
        if term < 1e-18:
            break
    return True


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
        missing = max(0, gates.min_requests - new.requests) + max(
            0, gates.min_requests - stable.requests
        )
        return Verdict(None, f"waiting for {gates.min_requests} requests on each revision "
                       f"({new.requests} new, {stable.requests} stable: {missing} "
                       f"missing)")  # fmt: skip
    for name, mine, theirs, ratio, buckets in (
        ("p99 TTFT", new.p99_ttft_s, stable.p99_ttft_s, gates.max_p99_ttft_ratio,
         new.ttft_buckets),
        ("p99 end-to-end", new.p99_e2e_s, stable.p99_e2e_s, gates.max_p99_e2e_ratio,
         new.e2e_buckets),
    ):  # fmt: skip
        if theirs <= 0 or mine <= theirs * ratio:
            continue
        failed = f"{name} {mine:.3f}s > {ratio:g} x stable {theirs:.3f}s"
        if not buckets:  # no counts to weigh: the p99s as they are
            return Verdict(False, failed)
        # a p99 over the bound means more than 1 % of the requests over it: fail when
        # the requests certainly over it are more than chance explains, not on the one
        # or two slowest of a small sample that a bucket edge put on the wrong side
        bound, n = theirs * ratio, sum(buckets)
        slow = slower_than(buckets, bound)
        if beyond_chance(slow, n):
            return Verdict(False, f"{failed}: {slow} of {n} requests over {bound:.3f}s, more "
                           f"than a {TAIL:.0%} tail explains")  # fmt: skip
    return Verdict(True, "every gate passed")


def idle(new: Window, stable: Window, gates: Gates) -> Verdict | None:
    """A passed verdict when both revisions together served fewer than ``min_requests`` over
    the window (nothing to judge, nobody to harm), else None."""
    seen = new.requests + stable.requests
    if seen >= gates.min_requests:
        return None
    return Verdict(True, f"idle: {seen} requests in the window, nothing to judge")


def judge_kept(new: Window, before: Window, gates: Gates) -> Verdict:
    """Blue-green after the switch: the new revision has all the traffic, so it is judged
    against ``before``, what the stable one served from the rollout's start to the switch.
    A ``before`` under ``min_requests`` is no baseline: the new revision's errors are then
    held to ``max_error_rate_increase`` over none, and latency is not compared."""
    if before.requests >= gates.min_requests:
        return judge(new, before, gates)
    verdict = judge(new, Window(gates.min_requests, 0, 0.0, 0.0), gates)
    if verdict.passed is None:
        return Verdict(None, f"waiting for {gates.min_requests} requests on the new revision "
                       f"({new.requests} so far)")  # fmt: skip
    note = f"; {before.requests} requests before the switch: errors only, no latency baseline"
    return Verdict(verdict.passed, verdict.reason + note)


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


def start(now: datetime, policy: CanaryPolicy | None = None) -> Rollout:
    if policy is not None and policy.blue_green:
        return Rollout(0, Phase.SCALING, now, "bringing the new revision up at full size beside "
                       "the stable one; traffic stays on the stable revision")  # fmt: skip
    return Rollout(0, Phase.SCALING, now, "pre-scaling the new revision for the first step")


def share(r: Rollout, policy: CanaryPolicy) -> float:
    """The new revision's share of traffic now: 0 until its first step is ready and held."""
    if r.phase is Phase.PROMOTED:
        return 1.0
    if r.phase is Phase.ROLLED_BACK:
        return 0.0
    phase = r.paused_from if r.phase is Phase.PAUSED else r.phase
    held = phase in (Phase.HOLDING, Phase.KEEPING)
    at = r.step if held else r.step - 1  # scaling: the last step's share
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


def on_baseline(r: Rollout, policy: CanaryPolicy) -> bool:
    """The step ``r`` is at (or scaling to) gives the new revision all the traffic — a
    canary's 100 % step, blue-green's only one — so the stable revision serves nothing in
    its window: the gates compare the new revision with what the stable one served before
    the switch (`judge_kept`), else a gate would wait for ever for stable requests."""
    return _step_share(r, policy) >= 1.0


def _step_share(r: Rollout, policy: CanaryPolicy) -> float:
    """The share of the step ``r`` is at or scaling to."""
    return policy.steps[min(r.step, len(policy.steps) - 1)]


def replicas_for(total: int, r: Rollout, policy: CanaryPolicy) -> int:
    """Ready replicas the new revision needs before traffic moves to its next share."""
    return split(total, _step_share(r, policy))[0]


def decide(
    r: Rollout,
    policy: CanaryPolicy,
    now: datetime,
    new_ready: int,
    total: int,
    new: Window,
    stable: Window,
    waiting: Mapping[str, int] | None = None,
) -> Rollout:
    """One look at a running rollout: scale, hold, advance, switch, promote or roll back.
    While a blue-green keeps (``Phase.KEEPING``), and while a canary holds a step that gives
    the new revision all the traffic (`on_baseline`), ``stable`` is the stable revision's
    window before the switch (`judge_kept`), not its traffic since: it has none. ``waiting``: where
    the deployment's replicas wait for GPUs (``cluster/pool`` → replicas), named in the
    reason while the new revision scales."""
    if r.done or r.phase is Phase.PAUSED:
        return r
    if total <= 0:  # a revision that serves nothing is never judged, so never promoted
        return replace(r, reason="nothing is placed for the deployment: waiting for capacity")
    if r.phase is Phase.SCALING:
        if share(r, policy) > 0:  # the last step's share still goes to the new revision
            verdict = judge(new, stable, policy.gates)
            if verdict.passed is False:
                return Rollout(r.step, Phase.ROLLED_BACK, now, f"gate failed: {verdict.reason}")
        need = replicas_for(total, r, policy)
        if new_ready < need:
            reason = _scaling_reason(need, new_ready, policy, r) + _waiting_note(waiting or {})
            return replace(r, reason=reason)
        if policy.blue_green:
            return Rollout(r.step, Phase.KEEPING, now, f"switched: all traffic on the new "
                           f"revision, the stable one kept {policy.keep_s:g}s")  # fmt: skip
        return Rollout(r.step, Phase.HOLDING, now, f"at {policy.steps[r.step]:.0%}")
    if r.phase is Phase.KEEPING:
        return _kept(r, policy, now, new, stable)
    if on_baseline(r, policy):  # the stable revision has no traffic to compare with now
        verdict = judge_kept(new, stable, policy.gates)
    else:
        verdict = judge(new, stable, policy.gates)
    if verdict.passed is False:
        return Rollout(r.step, Phase.ROLLED_BACK, now, f"gate failed: {verdict.reason}")
    if (now - r.since).total_seconds() < policy.hold_s:
        return replace(r, reason=verdict.reason if verdict.passed is None else r.reason)
    if verdict.passed is None:
        verdict = idle(new, stable, policy.gates) or verdict
        if verdict.passed is None:
            return replace(r, reason=verdict.reason)
    passed = "" if verdict.reason == "every gate passed" else f" ({verdict.reason})"
    if r.step + 1 >= len(policy.steps):
        return Rollout(r.step, Phase.PROMOTED, now, f"the last step passed its gates{passed}")
    return Rollout(r.step + 1, Phase.SCALING, now, f"{policy.steps[r.step]:.0%} passed{passed}")


def _scaling_reason(need: int, ready: int, policy: CanaryPolicy, r: Rollout) -> str:
    if policy.blue_green:
        return (f"waiting for {need} ready replicas of the new revision ({ready} now), a full "
                f"copy beside the stable one; traffic stays on the stable revision")  # fmt: skip
    return (f"waiting for {need} ready replicas of the new revision ({ready} now) before "
            f"{policy.steps[r.step]:.0%}")  # fmt: skip


def _waiting_note(waiting: Mapping[str, int]) -> str:
    where = ", ".join(f"{n} on {at}" for at, n in sorted(waiting.items()) if n > 0)
    return f"; replicas waiting for GPUs: {where}" if where else ""


def _kept(r: Rollout, policy: CanaryPolicy, now: datetime, new: Window, before: Window) -> Rollout:
    """Blue-green's keep window: roll back on a failed gate, promote when it is over."""
    verdict = judge_kept(new, before, policy.gates)
    if verdict.passed is False:
        return Rollout(r.step, Phase.ROLLED_BACK, now, f"gate failed: {verdict.reason}")
    keep_s = policy.keep_s or 0.0
    if (now - r.since).total_seconds() < keep_s:
        return replace(r, reason=f"switched; the stable revision is kept {keep_s:g}s for an "
                       f"instant rollback: {verdict.reason}")  # fmt: skip
    if verdict.passed is None:
        seen = f"{new.requests} requests on the new revision, too few to judge; no gate failed"
        return Rollout(r.step, Phase.PROMOTED, now, f"kept {keep_s:g}s: {seen}")
    return Rollout(r.step, Phase.PROMOTED, now, f"kept {keep_s:g}s: {verdict.reason}")


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
    found = LANE.fullmatch(entry)
    return (found["deployment"], int(found["revision"])) if found else None


def _filled(quotas: Sequence[PoolQuota], n: int) -> list[PoolQuota]:
    """``n`` replicas over the pools in their order of preference, each up to its max."""
    out, left = [], n
    for q in quotas:
        take = min(left, q.max)
        out.append(PoolQuota(pool=q.pool, min=take, max=take))
        left -= take
    return out


def entry_sizes(here: int, r: Rollout, policy: CanaryPolicy) -> tuple[int, int] | None:
    """(stable, new) replicas of a deployment's two entries on a cluster where ``here`` are
    placed while ``r`` runs (`lane_entries`); None when there is no lane (done, or nothing
    placed here). A canary splits ``here`` (each side rounded up) and pre-scales the new
    revision to the next step's share while scaling; blue-green keeps the stable revision
    whole beside it."""
    if r.done or here <= 0:
        return None
    phase = r.paused_from if r.phase is Phase.PAUSED else r.phase
    now_share = share(r, policy)
    lane_n = replicas_for(here, r, policy) if phase is Phase.SCALING else split(here, now_share)[0]
    return (here if policy.blue_green else split(here, now_share)[1]), lane_n


def extra_gpus(here: int, stable_gpus: int, new_gpus: int, r: Rollout, policy: CanaryPolicy) -> int:
    """GPUs a running rollout needs on a cluster beyond the ``here`` replicas placement gave
    the deployment (``new_gpus`` each, its current shape): its two entries' replicas at
    their own revision's GPUs per replica (``stable_gpus`` for the stable one), less what is
    placed. A canary's is the replica its rounding or pre-scaling adds (and any change of
    GPUs per replica); blue-green's is the whole second copy."""
    sizes = entry_sizes(here, r, policy)
    if sizes is None:
        return 0
    kept, lane_n = sizes
    return max(0, kept * stable_gpus + lane_n * new_gpus - here * new_gpus)


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
    sizes = entry_sizes(here, r, policy)
    if sizes is None:
        return [entry]
    lane_n = sizes[1]
    now_share = share(r, policy)
    phase = r.paused_from if r.phase is Phase.PAUSED else r.phase
    auto = entry.autoscaling.model_copy(update={"scale_to_zero_idle_seconds": None, "schedule": []})
    if policy.blue_green:
        kept = _kept_whole(entry, here, stable, auto, switched=phase is Phase.KEEPING)
    else:
        kept = _kept_part(entry, stable, now_share)
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


def _kept_whole(
    entry: DeploymentDesired,
    here: int,
    stable: RevisionSpec,
    auto: AutoscalingPolicy,
    switched: bool,
) -> DeploymentDesired:
    """Blue-green's stable entry: as it was until the switch (it serves everything); after
    it, pinned at no fewer than ``here`` replicas and never scaled to zero, although it has
    no traffic, so that a rollback finds it whole."""
    if not switched:
        return entry.model_copy(update={"spec": stable})
    floor = min(here, entry.quota.max)
    return entry.model_copy(
        update={
            "spec": stable,
            "quota": ReplicaQuota(min=max(entry.quota.min, floor), max=entry.quota.max),
            "pool_quotas": [
                PoolQuota(pool=q.pool, min=max(q.min, f.min), max=q.max)
                for q, f in zip(entry.pool_quotas, _filled(entry.pool_quotas, floor), strict=True)
            ],
            "autoscaling": auto,
        }
    )


def _kept_part(
    entry: DeploymentDesired, stable: RevisionSpec, now_share: float
) -> DeploymentDesired:
    """A canary's stable entry: its quota scaled to the stable revision's share."""

    def stable_part(n: int) -> int:
        return split(n, now_share)[1]

    return entry.model_copy(
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
