"""A deployment's shadow lane in one cluster's desired state and the shadow report's sides
(`controlplane.shadows`): pure, no database."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane import rollouts, shadows
from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    OutcomeCounters,
    PoolQuota,
    ReplicaQuota,
    RevisionSpec,
)
from controlplane.specs import DeploymentSpec, ShadowSpec

LIVE = RevisionSpec(model_id="m", revision="3", engine_image="vllm:live", engine_args=["--a"])


def make_entry() -> DeploymentDesired:
    return DeploymentDesired(
        name="chat",
        spec=LIVE,
        quota=ReplicaQuota(min=2, max=6),
        pools=["rsv", "od"],
        pool_quotas=[PoolQuota(pool="rsv", min=2, max=4), PoolQuota(pool="od", max=2)],
        hold_leaving=1,
        autoscaling=AutoscalingPolicy(scale_to_zero_idle_seconds=300.0),
    )


def test_the_shadow_lane_serves_its_deployment_by_copies_at_a_fixed_size():
    lane = shadows.shadow_entry(make_entry(), ShadowSpec(share=0.1, replicas=2))
    assert lane.name == "chat--shadow" and shadows.shadow_of(lane.name) == "chat"
    assert (lane.serves, lane.mirror, lane.traffic_share) == ("chat", True, 0.1)
    assert (lane.quota.min, lane.quota.max, lane.pool_quotas, lane.hold_leaving) == (2, 2, [], 0)
    assert lane.pools == ["rsv", "od"]  # the deployment's pools, any of them
    assert lane.autoscaling.scale_to_zero_idle_seconds is None
    assert lane.spec.model_copy(update={"revision": "3"}) == LIVE  # nothing changed but its id


def test_the_shadow_changes_only_the_fields_it_sets():
    lane = shadows.shadow_entry(
        make_entry(), ShadowSpec(share=0.5, engine_image="vllm:next", engine_args=[])
    )
    assert (lane.spec.engine_image, lane.spec.engine_args) == ("vllm:next", [])
    assert (lane.spec.model_id, lane.spec.gpus_per_replica) == ("m", LIVE.gpus_per_replica)


def test_its_revision_follows_the_changed_fields_and_the_base_not_the_share():
    a = shadows.shadow_revision("3", ShadowSpec(share=0.1, engine_image="x"))
    assert a == shadows.shadow_revision("3", ShadowSpec(share=0.9, replicas=4, engine_image="x"))
    assert a != shadows.shadow_revision("3", ShadowSpec(share=0.1, engine_image="y"))
    assert a != shadows.shadow_revision("4", ShadowSpec(share=0.1, engine_image="x"))
    assert a.startswith("3-shadow-") and not a.isdigit()


def test_names_never_clash_with_deployments_or_rollout_lanes():
    assert shadows.shadow_of("chat") is None and shadows.shadow_of("--shadow") is None
    assert shadows.shadow_of("chat--r2") is None
    assert rollouts.lane_of(shadows.shadow_name("chat")) is None
    base = {"model_id": "m", "gpus_per_replica": 1, "gpu_types": ["L4"]}
    with pytest.raises(ValidationError, match="shadow lane"):
        DeploymentSpec.model_validate({**base, "name": "chat--shadow"})


def counters(since: str, requests: int, errors: int = 0, at: int = 3, dropped: int = 0):
    buckets = [0] * 13
    buckets[at] = requests
    return OutcomeCounters(since=since, requests=requests, errors=errors,
                           ttft_buckets=buckets, e2e_buckets=buckets, dropped=dropped)  # fmt: skip


def test_the_sides_are_each_entrys_counters_since_the_start_summed_over_clusters():
    start = {"a": {"chat": counters("r1", 100), "chat--shadow": counters("r1", 10, dropped=2)}}
    slow = [0] * 13
    slow[3], slow[7] = 10, 5  # the 10 before, and 5 more within 5 s
    slow_since = OutcomeCounters(since="r1", requests=15, errors=1, ttft_buckets=slow,
                                 e2e_buckets=slow, dropped=5)  # fmt: skip
    now = {
        "a": {"chat": counters("r1", 150), "chat--shadow": slow_since},
        "b": {"chat": counters("r9", 30), "chat--shadow": counters("r9", 6, dropped=1)},
        "c": {"other": counters("r1", 999)},
    }
    live, shadow = shadows.sides(start, now, "chat")
    assert (live.requests, live.errors, live.dropped, live.p99_e2e_s) == (80, 0, 0, 0.25)
    assert (shadow.requests, shadow.errors, shadow.dropped) == (11, 1, 4)
    assert shadow.p50_ttft_s == 0.25 and shadow.p99_ttft_s == 5.0  # 6 fast on b, 5 slow on a
    assert shadow.error_rate == pytest.approx(1 / 11)


def test_a_restarted_router_counts_from_its_new_start():
    start = {"a": {"chat--shadow": counters("r1", 50, dropped=20)}}
    now = {"a": {"chat--shadow": counters("r2", 5, dropped=1)}}
    _, shadow = shadows.sides(start, now, "chat")
    assert (shadow.requests, shadow.dropped) == (5, 1)
    empty, _ = shadows.sides({}, {}, "chat")
    assert (empty.requests, empty.error_rate, empty.p99_ttft_s) == (0, 0.0, 0.0)
