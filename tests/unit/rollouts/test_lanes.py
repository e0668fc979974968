"""Rollout lanes in one cluster's desired state (`rollouts.lane_entries`) and the gates'
windows from stored counters (`services.rollouts.windows`): pure, no database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from controlplane import rollouts as ro
from controlplane.contracts import (
    DeploymentDesired,
    OutcomeCounters,
    PoolQuota,
    ReplicaQuota,
    RevisionSpec,
)
from controlplane.services.rollout_windows import windows

T0 = datetime(2026, 12, 1, tzinfo=UTC)
POLICY = ro.CanaryPolicy(steps=(0.05, 0.25, 0.5, 1.0), hold_s=300)
NEW = RevisionSpec(model_id="m", revision="2", engine_image="vllm:new")
STABLE = RevisionSpec(model_id="m", revision="1", engine_image="vllm:old")


def make_entry(replicas: int = 20) -> DeploymentDesired:
    return DeploymentDesired(
        name="chat",
        spec=NEW,
        quota=ReplicaQuota(min=min(4, replicas), max=replicas),
        pools=["rsv", "od"],
        pool_quotas=[PoolQuota(pool="rsv", min=4, max=12), PoolQuota(pool="od", max=8)],
        routing_weight=0.5,
    )


def entries(r: ro.Rollout, here: int = 20) -> dict[str, DeploymentDesired]:
    out = ro.lane_entries(make_entry(here), here, STABLE, r, POLICY, ro.lane_name("chat", 2))
    return {e.name: e for e in out}


def test_while_scaling_the_lane_is_pre_scaled_and_takes_no_traffic():
    got = entries(ro.start(T0))
    stable, lane = got["chat"], got["chat--r2"]
    assert stable.spec == STABLE and stable.quota == ReplicaQuota(min=4, max=20)
    assert (lane.spec, lane.serves, lane.traffic_share) == (NEW, "chat", 0.0)
    assert lane.quota == ReplicaQuota(min=1, max=1)  # 5 % of 20, ready before traffic moves
    assert lane.pool_quotas == [PoolQuota(pool="rsv", min=1, max=1), PoolQuota(pool="od")]
    assert lane.routing_weight == stable.routing_weight == 0.5


def test_holding_splits_the_replicas_by_the_share_and_the_stable_shrinks():
    held = ro.Rollout(1, ro.Phase.HOLDING, T0)  # 25 %
    got = entries(held)
    assert got["chat--r2"].traffic_share == 0.25
    assert got["chat--r2"].quota == ReplicaQuota(min=5, max=5)
    assert got["chat"].quota == ReplicaQuota(min=3, max=15)
    assert got["chat"].pool_quotas == [
        PoolQuota(pool="rsv", min=3, max=9),
        PoolQuota(pool="od", max=6),
    ]


def test_a_paused_canary_keeps_the_sizes_it_paused_with():
    scaling = ro.Rollout(2, ro.Phase.SCALING, T0)  # towards 50 %, 25 % of the traffic now
    paused = ro.pause(scaling, T0)
    assert entries(paused) == entries(scaling)
    assert (
        entries(paused)["chat--r2"].quota.max == 10
        and entries(paused)["chat--r2"].traffic_share == 0.25
    )


def test_a_finished_canary_or_one_placed_nowhere_here_is_the_entry_as_it_is():
    for done in (ro.Rollout(3, ro.Phase.PROMOTED, T0), ro.Rollout(0, ro.Phase.ROLLED_BACK, T0)):
        assert list(entries(done)) == ["chat"] and entries(done)["chat"].spec == NEW
    assert list(entries(ro.start(T0), here=0)) == ["chat"]


def test_the_lane_keeps_its_size_whatever_the_load_says():
    lane = entries(replace(ro.start(T0)))["chat--r2"]
    assert lane.autoscaling.scale_to_zero_idle_seconds is None and lane.autoscaling.schedule == []
    assert lane.hold_leaving == 0


def test_lane_names_map_back_to_their_deployment():
    assert ro.lane_of(ro.lane_name("chat-llm", 12)) == ("chat-llm", 12)
    assert ro.lane_of("chat-llm") is None and ro.lane_of("chat--rx") is None


def counters(since: str, requests: int, errors: int, slow: int = 0) -> dict[str, object]:
    fast = requests - slow
    buckets = [0, 0, 0, fast, 0, 0, slow] + [0] * 6  # 0.25 s, or 2.5 s for the slow ones
    return OutcomeCounters(
        since=since, requests=requests, errors=errors, ttft_buckets=buckets, e2e_buckets=buckets
    ).model_dump(mode="json")


def test_windows_count_only_what_happened_since_the_hold_began_on_every_cluster():
    start = {"a": {"chat": counters("s1", 1000, 10), "chat--r2": counters("s1", 10, 0)}}
    now = {
        "a": {"chat": counters("s1", 1300, 12), "chat--r2": counters("s1", 110, 5, slow=50)},
        "b": {"chat": counters("s2", 200, 0), "chat--r2": counters("s2", 50, 0)},
        "c": {"other": counters("s3", 999, 999)},
    }
    stable, new = windows(start, now, "chat", 2)
    assert (stable.requests, stable.errors, stable.p99_ttft_s) == (500, 2, 0.25)
    assert (new.requests, new.errors, new.p99_e2e_s) == (150, 5, 2.5)


def test_a_router_that_restarted_counts_from_its_new_start():
    start = {"a": {"chat": counters("s1", 1000, 10)}}
    stable, new = windows(start, {"a": {"chat": counters("s9", 40, 1)}}, "chat", 2)
    assert (stable.requests, stable.errors, new.requests) == (40, 1, 0)


# the GPUs placement holds for the lanes (`rollouts.extra_gpus`) -------------------------


def _lane_gpus(r: ro.Rollout, policy: ro.CanaryPolicy, here: int, stable_gpus: int, new_gpus: int):
    """What the two entries of `lane_entries` run, in GPUs, beyond ``here`` placed replicas."""
    stable = STABLE.model_copy(update={"gpus_per_replica": stable_gpus})
    entry = make_entry(here).model_copy(
        update={"spec": NEW.model_copy(update={"gpus_per_replica": new_gpus})}
    )
    out = ro.lane_entries(entry, here, stable, r, policy, "chat--r2")
    return sum(e.quota.max * e.spec.gpus_per_replica for e in out) - here * new_gpus


def test_the_extra_gpus_are_what_the_lane_entries_run_beyond_the_placed_replicas():
    green = ro.blue_green(600)
    cases = [
        (ro.start(T0), POLICY, 20, 1, 1, 1),  # pre-scaled 5 %: one replica more
        (ro.Rollout(1, ro.Phase.HOLDING, T0), POLICY, 20, 1, 1, 0),  # 25 % of 20 splits evenly
        (ro.Rollout(1, ro.Phase.HOLDING, T0), POLICY, 7, 1, 1, 1),  # ceil(1.75) + ceil(5.25)
        (ro.start(T0), green, 20, 1, 1, 20),  # blue-green: the whole second copy
        (ro.Rollout(0, ro.Phase.KEEPING, T0), green, 20, 1, 1, 20),
        (ro.Rollout(1, ro.Phase.HOLDING, T0), POLICY, 20, 2, 1, 15),  # the stable side's 2 GPUs
        (ro.Rollout(1, ro.Phase.HOLDING, T0), POLICY, 20, 1, 2, 0),  # smaller old shape: none
    ]
    for r, policy, here, stable_gpus, new_gpus, extra in cases:
        assert ro.extra_gpus(here, stable_gpus, new_gpus, r, policy) == extra
        assert max(0, _lane_gpus(r, policy, here, stable_gpus, new_gpus)) == extra


def test_a_finished_or_absent_rollout_holds_nothing():
    assert ro.extra_gpus(20, 1, 1, ro.Rollout(3, ro.Phase.PROMOTED, T0), POLICY) == 0
    assert ro.extra_gpus(20, 1, 1, ro.Rollout(0, ro.Phase.ROLLED_BACK, T0), POLICY) == 0
    assert ro.extra_gpus(0, 1, 1, ro.start(T0), ro.blue_green(600)) == 0
    paused = ro.Rollout(0, ro.Phase.PAUSED, T0, paused_from=ro.Phase.SCALING)
    assert ro.extra_gpus(20, 1, 1, paused, POLICY) == 1
