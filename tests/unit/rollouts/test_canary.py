"""Canary decisions (controlplane/rollouts.py): pre-scale, hold, gates, promote, roll back,
and the operator's commands — pure, with the clock passed in."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from controlplane import rollouts as ro
from controlplane.contracts import LATENCY_BUCKETS_S, OutcomeCounters

T0 = datetime(2026, 12, 1, tzinfo=UTC)
POLICY = ro.CanaryPolicy(steps=(0.05, 0.25, 0.5, 1.0), hold_s=300)
GOOD = ro.Window(requests=1000, errors=2, p99_ttft_s=0.20, p99_e2e_s=2.0)
STABLE = ro.Window(requests=1000, errors=3, p99_ttft_s=0.21, p99_e2e_s=2.1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_good_revision_is_pre_scaled_held_and_promoted_step_by_step():
    r, t, shares = ro.start(T0), 0.0, []
    for _ in range(20):
        ready = ro.replicas_for(20, r, POLICY)  # the autoscaler brought them up
        r = ro.decide(r, POLICY, at(t), ready, 20, GOOD, STABLE)
        shares.append(ro.share(r, POLICY))
        t += 301
        if r.done:
            break
    assert r.phase is ro.Phase.PROMOTED and ro.share(r, POLICY) == 1.0
    assert sorted(set(shares)) == [0.05, 0.25, 0.5, 1.0]


def test_no_traffic_moves_before_the_new_revision_has_the_replicas_for_the_step():
    r = ro.decide(ro.start(T0), POLICY, at(10), 0, 20, GOOD, STABLE)
    assert r.phase is ro.Phase.SCALING and ro.share(r, POLICY) == 0.0
    assert "waiting for 1 ready replicas" in r.reason
    held = ro.decide(r, POLICY, at(20), 1, 20, GOOD, STABLE)
    assert held.phase is ro.Phase.HOLDING and ro.share(held, POLICY) == 0.05
    assert ro.decide(held, POLICY, at(200), 1, 20, GOOD, STABLE).step == 0  # still holding
    nxt = ro.decide(held, POLICY, at(321), 1, 20, GOOD, STABLE)
    assert (nxt.phase, nxt.step, ro.share(nxt, POLICY)) == (ro.Phase.SCALING, 1, 0.05)
    assert ro.replicas_for(20, nxt, POLICY) == 5


def test_a_revision_with_errors_rolls_back_at_the_first_gate_without_waiting_for_the_hold():
    bad = ro.Window(requests=120, errors=24, p99_ttft_s=0.2, p99_e2e_s=2.0)  # 20 %
    holding = ro.decide(ro.start(T0), POLICY, at(1), 1, 20, GOOD, STABLE)
    r = ro.decide(holding, POLICY, at(60), 1, 20, bad, STABLE)
    assert r.phase is ro.Phase.ROLLED_BACK and ro.share(r, POLICY) == 0.0
    assert "error rate 20.0%" in r.reason


def test_a_slow_revision_fails_the_latency_gate_once_the_sample_is_big_enough():
    slow = ro.Window(requests=1000, errors=2, p99_ttft_s=0.7, p99_e2e_s=6.0)  # 3x
    holding = ro.decide(ro.start(T0), POLICY, at(1), 1, 20, GOOD, STABLE)
    few = ro.Window(requests=10, errors=0, p99_ttft_s=0.7, p99_e2e_s=6.0)
    waiting = ro.decide(holding, POLICY, at(400), 1, 20, few, STABLE)
    assert waiting.phase is ro.Phase.HOLDING and "waiting for 100 requests" in waiting.reason
    r = ro.decide(holding, POLICY, at(400), 1, 20, slow, STABLE)
    assert r.phase is ro.Phase.ROLLED_BACK and "p99 TTFT 0.700s > 1.5 x stable" in r.reason


def _measured(fast: int, slow: int, slow_s: float) -> ro.Window:
    """A window from buckets: `fast` requests within 25 ms, `slow` ones in the bucket up
    to `slow_s`."""
    ttft = [0] * (len(LATENCY_BUCKETS_S) + 1)
    ttft[0] += fast
    ttft[LATENCY_BUCKETS_S.index(slow_s)] += slow
    e2e = [fast + slow] + [0] * len(LATENCY_BUCKETS_S)
    counters = OutcomeCounters(since="s", requests=fast + slow, errors=0, ttft_buckets=ttft,
                               e2e_buckets=e2e)  # fmt: skip
    return ro.window_of([counters])


def test_one_slow_request_of_a_small_sample_does_not_fail_the_latency_gate():
    """Found by bench/rollout.py: a good blue-green revision rolled back on "p99 TTFT
    0.050s > 1.5 x stable 0.025s" with ~30 requests: the p99 of a small sample is its
    slowest request, and one request over a bucket edge doubled the bucketed p99."""
    stable = _measured(400, 0, 0.025)
    gates = ro.Gates(min_requests=20)
    one_slow = _measured(29, 1, 0.05)
    assert one_slow.p99_ttft_s == 0.05  # twice the stable p99 on the bucket grid ...
    assert ro.judge(one_slow, stable, gates).passed is True  # ... but not beyond chance
    # a revision really slower fails: 5 of 30 over 4x the stable p99
    slow = _measured(25, 5, 0.1)
    verdict = ro.judge(slow, stable, gates)
    assert verdict.passed is False
    assert "p99 TTFT 0.100s > 1.5 x stable 0.025s: 5 of 30 requests over 0.038s" in verdict.reason


def test_the_latency_gate_weighs_the_slow_share_against_a_one_percent_tail():
    stable = _measured(1000, 0, 0.025)
    # 1.2 % slow over 1,000 requests: a p99 over the bound, within what chance gives
    assert ro.judge(_measured(988, 12, 0.1), stable, ro.Gates()).passed is True
    # 3 % slow: more than a 1 % tail explains
    assert ro.judge(_measured(970, 30, 0.1), stable, ro.Gates()).passed is False
    assert ro.beyond_chance(4, 30) and not ro.beyond_chance(3, 30)
    assert ro.beyond_chance(22, 1000) and not ro.beyond_chance(21, 1000)
    assert not ro.beyond_chance(0, 0)


def test_errors_certain_to_fail_the_gate_roll_back_before_the_minimum_sample():
    early = ro.Window(requests=30, errors=5, p99_ttft_s=0.2, p99_e2e_s=2.0)
    verdict = ro.judge(early, STABLE, ro.Gates())
    assert verdict.passed is False  # 5 > 1.3 % of 100: no later traffic can save it
    assert ro.judge(ro.Window(30, 1, 0.2, 2.0), STABLE, ro.Gates()).passed is None


def test_pause_resume_promote_and_rollback_by_an_operator():
    holding = ro.decide(ro.start(T0), POLICY, at(1), 1, 20, GOOD, STABLE)
    paused = ro.pause(holding, at(100))
    assert ro.share(paused, POLICY) == 0.05  # traffic stays where it was
    assert ro.decide(paused, POLICY, at(999), 1, 20, GOOD, STABLE) is paused
    resumed = ro.resume(paused, at(200))
    assert resumed.phase is ro.Phase.HOLDING and resumed.since == at(200)  # hold anew
    assert ro.promote(resumed, at(201)).phase is ro.Phase.PROMOTED
    back = ro.rollback(resumed, at(201))
    assert back.phase is ro.Phase.ROLLED_BACK and ro.rollback(back, at(300)) is back


def test_the_replicas_split_between_revisions_without_doubling():
    assert ro.split(20, 0.0) == (0, 20)
    assert ro.split(20, 0.05) == (1, 19)
    assert ro.split(20, 0.25) == (5, 15)
    assert ro.split(3, 0.5) == (2, 2)  # at most one more than the deployment's size
    assert ro.split(20, 1.0) == (20, 0)


def test_windows_come_from_the_difference_of_two_router_reports_summed_over_planes():
    width = len(LATENCY_BUCKETS_S) + 1
    at_100ms, at_1s, rest = LATENCY_BUCKETS_S.index(0.1), LATENCY_BUCKETS_S.index(1.0), width - 1

    def report(since: str, requests: int, errors: int, slow: int) -> OutcomeCounters:
        ttft = [0] * width
        ttft[at_100ms], ttft[at_1s] = requests - slow, slow
        e2e = [0] * width
        e2e[rest] = requests
        return OutcomeCounters(since=since, requests=requests, errors=errors,
                               ttft_buckets=ttft, e2e_buckets=e2e)  # fmt: skip

    # plane a: 200 more requests, 3 of them slow; plane b restarted (a new since): all of it
    a = ro.outcomes_delta(report("a1", 100, 1, 0), report("a1", 300, 4, 3))
    b = ro.outcomes_delta(report("b1", 900, 50, 9), report("b2", 100, 0, 0))
    assert (a.requests, a.errors, b.requests, b.errors) == (200, 3, 100, 0)
    window = ro.window_of([a, b])
    assert (window.requests, window.errors) == (300, 3)
    assert window.p99_ttft_s == 0.1  # 3 slow of 300: exactly the 1 % above the p99
    assert window.p99_e2e_s == 2 * LATENCY_BUCKETS_S[-1]  # beyond the last bound
    worse = ro.window_of([ro.outcomes_delta(None, report("c", 100, 0, 5))])
    assert worse.p99_ttft_s == 1.0
    assert ro.window_of([]) == ro.Window(0, 0, 0.0, 0.0)


def test_at_a_100_percent_step_the_gates_use_the_stable_revisions_baseline():
    """The stable revision serves nothing at 100 %: ``stable`` is then its window before the
    switch, and one with too few requests to compare (a quiet stable) is no reason to wait
    for ever: the new revision is held to the error gate alone."""
    policy = ro.CanaryPolicy(steps=(0.5, 1.0), hold_s=2, gates=ro.Gates(min_requests=20))
    full = ro.Rollout(1, ro.Phase.HOLDING, T0, "at 100%")
    assert ro.on_baseline(full, policy) and not ro.on_baseline(replace(full, step=0), policy)
    quiet = ro.Window(requests=5, errors=0, p99_ttft_s=0.2, p99_e2e_s=2.0)
    good = ro.Window(requests=200, errors=1, p99_ttft_s=0.9, p99_e2e_s=9.0)
    promoted = ro.decide(full, policy, at(3), 2, 2, good, quiet)
    assert promoted.phase is ro.Phase.PROMOTED, promoted
    bad = ro.Window(requests=200, errors=20, p99_ttft_s=0.2, p99_e2e_s=2.0)
    assert ro.decide(full, policy, at(1), 2, 2, bad, quiet).phase is ro.Phase.ROLLED_BACK
    slow = ro.decide(full, policy, at(3), 2, 2, good, STABLE)  # a real baseline: compared
    assert slow.phase is ro.Phase.ROLLED_BACK and "p99 TTFT" in slow.reason


def test_a_revision_failing_while_the_next_step_scales_is_rolled_back():
    """Between two steps the lane keeps the last step's share while the next one's replicas
    start (GPUs to wait for, a model to load): its gates are judged there too. They were not,
    so 5 % of the users got errors for as long as the scaling took."""
    bad = ro.Window(requests=5000, errors=5000, p99_ttft_s=0.2, p99_e2e_s=2.0)
    scaling = ro.Rollout(1, ro.Phase.SCALING, T0)
    assert ro.share(scaling, POLICY) == 0.05
    r = ro.decide(scaling, POLICY, at(5 * 3600), 1, 20, bad, STABLE)
    assert r.phase is ro.Phase.ROLLED_BACK and "gate failed" in r.reason
    fine = ro.decide(scaling, POLICY, at(60), 1, 20, GOOD, STABLE)
    assert fine.phase is ro.Phase.SCALING  # still waiting for 5 ready replicas


def test_a_rollout_with_nothing_placed_waits_instead_of_promoting_unjudged():
    """With no replica anywhere every step was "ready" (0 of 0) and every hold passed as
    idle: promoted, and all traffic went to a revision nobody had judged once capacity came."""
    r, t = ro.start(T0), 0.0
    for _ in range(12):
        r = ro.decide(r, POLICY, at(t), 0, 0, ro.Window(0, 0, 0.0, 0.0), ro.Window(0, 0, 0.0, 0.0))
        t += 400
    assert (r.phase, r.step) == (ro.Phase.SCALING, 0) and ro.share(r, POLICY) == 0.0
    assert "nothing is placed" in r.reason
