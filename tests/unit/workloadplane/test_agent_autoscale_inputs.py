"""The autoscaler's inputs: the schedule mapped from the desired state, the vLLM gauges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.contracts import (
    AutoscalingPolicy,
    DeploymentDesired,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
    ScheduleWindow,
)
from workloadplane.autoscaler_loop import Autoscaler, Gauges, parse_gauges, schedule_rules
from workloadplane.router.core import Router


def test_bad_schedule_windows_are_skipped():
    good = ScheduleWindow(days=[1], start="08:00", end="18:00", min_replicas=4)
    bad_zone = ScheduleWindow(start="08:00", end="18:00", timezone="Mars/Olympus")
    bad_time = ScheduleWindow(start="8h", end="18:00")
    (rule,) = schedule_rules([good, bad_zone, bad_time])
    assert rule.weekdays == {1} and rule.min_replicas == 4


def test_parse_gauges_sums_waiting_and_averages_kv_cache():
    text = """# HELP vllm:num_requests_waiting Requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7 1700000000
vllm:num_requests_running 4
"""
    gauges = parse_gauges(text)
    assert gauges.num_requests_waiting == 5.0
    assert gauges.kv_cache_usage_perc == pytest.approx(0.6)
    assert parse_gauges("") == Gauges()


def test_replicas_reconcile_is_replacing_are_not_capacity_and_never_picked_to_drain():
    """A spot notice: the replica on the draining instance serves until its replacement is
    ready. Three ready replicas for a max of two must not make the autoscaler drain one
    that stays (reconcile drains the leaving one itself)."""
    deployment = DeploymentDesired(
        name="chat", spec=RevisionSpec(model_id="org/chat", revision="r1"),
        quota=ReplicaQuota(min=2, max=2),
        autoscaling=AutoscalingPolicy(window_seconds=1, scale_down_delay_seconds=0),
    )  # fmt: skip
    replicas = [ReplicaStatus(replica_id=rid, deployment="chat", revision="r1", state="ready")
                for rid in ("on-draining-instance", "stays-1", "stays-2")]  # fmt: skip
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    autoscaler = Autoscaler(Router(), lambda: now)
    signals = autoscaler.signals(deployment, replicas, now, leaving={"on-draining-instance"})
    assert signals is not None
    phases = {s.replica_id: s.phase for s in signals.replicas}
    assert phases == {"on-draining-instance": "draining", "stays-1": "ready", "stays-2": "ready"}
    for second in range(5):
        later = now + timedelta(seconds=second)
        decision = autoscaler.decide(deployment, replicas, later, {"on-draining-instance"})
        assert decision is not None
        assert decision.current_replicas == 2 and decision.drain == ()
    unaware = Autoscaler(Router(), lambda: now).decide(deployment, replicas, now)
    assert unaware is not None and unaware.current_replicas == 3  # what it did before


def test_gauges_that_are_not_finite_numbers_at_least_0_are_left_out():
    """A replica's NaN, +Inf or negative gauge made ``math.ceil`` raise inside the policy,
    and with it the agent's whole autoscale pass, at every tick."""
    text = """vllm:num_requests_waiting{engine="0"} NaN
vllm:num_requests_waiting{engine="1"} +Inf
vllm:num_requests_waiting{engine="2"} -3
vllm:num_requests_waiting{engine="3"} 2
vllm:kv_cache_usage_perc{engine="0"} NaN
vllm:kv_cache_usage_perc{engine="1"} -0.5
vllm:kv_cache_usage_perc{engine="2"} 1.7
vllm:kv_cache_usage_perc{engine="3"} 0.5
"""
    gauges = parse_gauges(text)
    assert gauges == Gauges(2.0, 0.75)  # KV usage is a fraction: 1.7 counts as 1
    assert parse_gauges("vllm:num_requests_waiting 1e308\n" * 2).num_requests_waiting == 0
    deployment = DeploymentDesired(
        name="chat", spec=RevisionSpec(model_id="org/chat", revision="r1"),
        quota=ReplicaQuota(min=1, max=4),
    )  # fmt: skip
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    autoscaler = Autoscaler(Router(), lambda: now)
    autoscaler.gauges["r-1"] = (now, parse_gauges(text.replace("engine", "e")))
    replica = ReplicaStatus(replica_id="r-1", deployment="chat", revision="r1", state="ready")
    decision = autoscaler.decide(deployment, [replica], now)
    assert decision is not None and decision.desired_replicas == 2  # 1 ready + 2 waiting / 8
