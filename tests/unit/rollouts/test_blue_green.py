"""Blue-green decisions and lanes (controlplane/rollouts.py), and the idle rule of a canary
step: pure, with the clock passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane import rollouts as ro
from controlplane.contracts import DeploymentDesired, PoolQuota, ReplicaQuota, RevisionSpec

T0 = datetime(2026, 12, 1, tzinfo=UTC)
BG = ro.blue_green(keep_s=600)
CANARY = ro.CanaryPolicy(steps=(0.05, 0.25, 0.5, 1.0), hold_s=300)
BEFORE = ro.Window(requests=1000, errors=3, p99_ttft_s=0.21, p99_e2e_s=2.1)
GOOD = ro.Window(requests=1000, errors=2, p99_ttft_s=0.20, p99_e2e_s=2.0)
QUIET = ro.Window(0, 0, 0.0, 0.0)
NEW = RevisionSpec(model_id="m", revision="2", engine_image="vllm:new")
STABLE = RevisionSpec(model_id="m", revision="1", engine_image="vllm:old")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def switched() -> ro.Rollout:
    r = ro.decide(ro.start(T0, BG), BG, at(30), 20, 20, QUIET, BEFORE)
    assert r.phase is ro.Phase.KEEPING
    return r


# decisions ----------------------------------------------------------------------------------


def test_blue_green_takes_no_traffic_until_every_replica_of_the_full_copy_is_ready():
    r = ro.start(T0, BG)
    assert "full size" in r.reason and ro.share(r, BG) == 0.0
    assert ro.replicas_for(20, r, BG) == 20  # the whole deployment, beside the stable one
    waiting = ro.decide(r, BG, at(10), 19, 20, QUIET, BEFORE)
    assert waiting.phase is ro.Phase.SCALING and ro.share(waiting, BG) == 0.0
    assert "waiting for 20 ready replicas of the new revision (19 now)" in waiting.reason
    assert "traffic stays on the stable revision" in waiting.reason
    short = ro.decide(r, BG, at(10), 19, 20, QUIET, BEFORE, waiting={"b/p1": 1, "a/p1": 0})
    assert short.reason.endswith("; replicas waiting for GPUs: 1 on b/p1")


def test_blue_green_switches_all_traffic_at_once_when_ready_and_promotes_after_the_keep():
    r = switched()
    assert ro.share(r, BG) == 1.0 and r.since == at(30) and "kept 600s" in r.reason
    kept = ro.decide(r, BG, at(629), 20, 20, GOOD, BEFORE)
    assert kept.phase is ro.Phase.KEEPING and "instant rollback" in kept.reason
    done = ro.decide(kept, BG, at(630), 20, 20, GOOD, BEFORE)
    assert done.phase is ro.Phase.PROMOTED and done.reason == "kept 600s: every gate passed"


def test_a_new_revision_failing_a_gate_during_the_keep_window_rolls_back_at_once():
    bad = ro.Window(requests=150, errors=30, p99_ttft_s=0.2, p99_e2e_s=2.0)
    r = ro.decide(switched(), BG, at(60), 20, 20, bad, BEFORE)
    assert r.phase is ro.Phase.ROLLED_BACK and ro.share(r, BG) == 0.0
    assert r.reason.startswith("gate failed: error rate 20.0%")
    slow = ro.Window(requests=1000, errors=0, p99_ttft_s=0.7, p99_e2e_s=2.0)
    assert ro.decide(switched(), BG, at(60), 20, 20, slow, BEFORE).phase is ro.Phase.ROLLED_BACK


def test_with_too_little_traffic_before_the_switch_only_errors_are_judged():
    few = ro.Window(requests=12, errors=0, p99_ttft_s=0.1, p99_e2e_s=1.0)
    slow = ro.Window(requests=1000, errors=5, p99_ttft_s=9.0, p99_e2e_s=20.0)
    verdict = ro.judge_kept(slow, few, ro.Gates())
    assert verdict.passed is True and "12 requests before the switch" in verdict.reason
    erring = ro.Window(requests=1000, errors=30, p99_ttft_s=0.1, p99_e2e_s=1.0)
    assert ro.judge_kept(erring, few, ro.Gates()).passed is False  # 3 % > 0 + 1 pp
    assert ro.judge_kept(QUIET, few, ro.Gates()).passed is None


def test_a_quiet_blue_green_is_promoted_when_its_keep_window_is_over():
    r = ro.decide(switched(), BG, at(700), 20, 20, ro.Window(3, 0, 0.1, 1.0), QUIET)
    assert r.phase is ro.Phase.PROMOTED
    assert r.reason == "kept 600s: 3 requests on the new revision, too few to judge; no gate failed"


def test_a_paused_blue_green_keeps_both_copies_and_a_rollback_is_instant():
    paused = ro.pause(switched(), at(100))
    assert ro.share(paused, BG) == 1.0
    assert ro.decide(paused, BG, at(10_000), 20, 20, GOOD, BEFORE) is paused  # not promoted
    resumed = ro.resume(paused, at(200))
    assert resumed.phase is ro.Phase.KEEPING and resumed.since == at(200)
    back = ro.rollback(resumed, at(201))
    assert back.phase is ro.Phase.ROLLED_BACK and ro.share(back, BG) == 0.0


# the idle rule (canary) ---------------------------------------------------------------------


def holding() -> ro.Rollout:
    r = ro.decide(ro.start(T0), CANARY, at(1), 1, 20, QUIET, QUIET)
    assert r.phase is ro.Phase.HOLDING
    return r


def test_an_idle_step_passes_when_its_hold_is_over_saying_so():
    quiet_new, quiet_stable = ro.Window(2, 0, 0.1, 1.0), ro.Window(40, 0, 0.1, 1.0)
    still = ro.decide(holding(), CANARY, at(200), 1, 20, quiet_new, quiet_stable)
    assert still.phase is ro.Phase.HOLDING  # the hold is not over
    r = ro.decide(holding(), CANARY, at(302), 1, 20, quiet_new, quiet_stable)
    assert (r.phase, r.step) == (ro.Phase.SCALING, 1)
    assert r.reason == "5% passed (idle: 42 requests in the window, nothing to judge)"


def test_an_idle_last_step_promotes():
    last = ro.Rollout(3, ro.Phase.HOLDING, T0)
    r = ro.decide(last, CANARY, at(301), 20, 20, QUIET, QUIET)
    assert r.phase is ro.Phase.PROMOTED and "idle: 0 requests" in r.reason


def test_with_traffic_but_too_little_on_the_new_revision_the_step_keeps_holding():
    few_new, busy_stable = ro.Window(30, 0, 0.1, 1.0), ro.Window(900, 0, 0.1, 1.0)
    r = ro.decide(holding(), CANARY, at(10_000), 1, 20, few_new, busy_stable)
    assert r.phase is ro.Phase.HOLDING and r.step == 0
    assert "(30 new, 900 stable: 70 missing)" in r.reason


def test_errors_on_a_quiet_step_still_fail_it():
    erring = ro.Window(10, 5, 0.1, 1.0)
    r = ro.decide(holding(), CANARY, at(301), 1, 20, erring, QUIET)
    assert r.phase is ro.Phase.ROLLED_BACK


# lanes ----------------------------------------------------------------------------------------


def make_entry() -> DeploymentDesired:
    return DeploymentDesired(
        name="chat",
        spec=NEW,
        quota=ReplicaQuota(min=2, max=12),
        pools=["rsv", "od"],
        pool_quotas=[PoolQuota(pool="rsv", min=2, max=6), PoolQuota(pool="od", max=6)],
    )


def entries(r: ro.Rollout, here: int = 8) -> dict[str, DeploymentDesired]:
    out = ro.lane_entries(make_entry(), here, STABLE, r, BG, ro.lane_name("chat", 2))
    return {e.name: e for e in out}


def test_while_scaling_the_stable_entry_is_whole_and_the_lane_a_full_copy_without_traffic():
    got = entries(ro.start(T0, BG))
    stable, lane = got["chat"], got["chat--r2"]
    assert stable.spec == STABLE and stable.quota == ReplicaQuota(min=2, max=12)
    assert (lane.spec, lane.serves, lane.traffic_share) == (NEW, "chat", 0.0)
    assert lane.quota == ReplicaQuota(min=8, max=8)
    assert lane.pool_quotas == [
        PoolQuota(pool="rsv", min=6, max=6),
        PoolQuota(pool="od", min=2, max=2),
    ]


def test_after_the_switch_the_stable_entry_is_pinned_at_full_size_with_no_traffic():
    got = entries(switched())
    stable, lane = got["chat"], got["chat--r2"]
    assert lane.traffic_share == 1.0 and lane.quota == ReplicaQuota(min=8, max=8)
    assert stable.spec == STABLE and stable.quota == ReplicaQuota(min=8, max=12)
    assert stable.pool_quotas == [
        PoolQuota(pool="rsv", min=6, max=6),
        PoolQuota(pool="od", min=2, max=6),
    ]
    assert stable.autoscaling.scale_to_zero_idle_seconds is None  # idle, but kept


def test_a_finished_blue_green_is_the_entry_as_it_is():
    for done in (ro.promote(switched(), at(1)), ro.rollback(switched(), at(1))):
        assert list(entries(done)) == ["chat"]
