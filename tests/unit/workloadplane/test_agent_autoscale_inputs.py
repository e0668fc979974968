"""The autoscaler's inputs: the schedule mapped from the desired state, the vLLM gauges."""

from __future__ import annotations

import pytest

from controlplane.contracts import ScheduleWindow
from workloadplane.autoscaler_loop import Gauges, parse_gauges, schedule_rules


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
