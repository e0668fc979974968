"""Request rates from two or more scrapes of cumulative router counters (pure, injected clock)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from controlplane.dashboard.rates import RequestRates, Sample, kept, rate
from controlplane.dashboard.routermetrics import requests_by_deployment


def test_one_scrape_gives_no_rate_and_two_give_requests_per_second():
    assert rate([Sample(0.0, {"chat": 10})], "chat") is None
    assert rate([Sample(0.0, {"chat": 10}), Sample(5.0, {"chat": 20})], "chat") == 2.0
    assert rate([Sample(0.0, {}), Sample(5.0, {"chat": 20})], "chat") == 4.0  # new deployment
    assert rate([Sample(0.0, {"chat": 10}), Sample(5.0, {"chat": 10})], "other") == 0.0
    assert rate([Sample(3.0, {"chat": 1}), Sample(3.0, {"chat": 9})], "chat") is None


def test_a_counter_that_went_down_counts_from_zero_like_prometheus():
    restarted = [Sample(0.0, {"chat": 100}), Sample(10.0, {"chat": 120}), Sample(20.0, {"chat": 5})]
    assert rate(restarted, "chat") == (20 + 5) / 20


def test_samples_outside_the_window_go_but_the_newest_before_it_stays():
    samples = [Sample(t, {}) for t in (0.0, 10.0, 50.0, 80.0, 100.0)]
    assert [s.at for s in kept(samples, now=100.0, window_s=60.0)] == [10.0, 50.0, 80.0, 100.0]
    sparse = [Sample(0.0, {}), Sample(500.0, {})]
    assert [s.at for s in kept(sparse, now=500.0, window_s=60.0)] == [0.0, 500.0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_process_memory_sums_routers_and_rescrapes_only_when_due():
    clock = Clock()
    rates = RequestRates(clock)
    assert rates.due(["a", "b"]) == ["a", "b"]
    rates.record("a", {"chat": 10})
    rates.record("b", {"chat": 0, "embed": 3})
    assert rates.per_deployment(["a", "b"], ["chat", "embed"]) == {}  # "—" until two scrapes
    clock.now += 0.5
    assert rates.due(["a", "b"]) == []  # a page reloaded at once reuses the last scrape
    clock.now += 1.5
    rates.record("a", {"chat": 30})
    rates.record("b", {"chat": 4, "embed": 3})
    assert rates.per_deployment(["a", "b"], ["chat", "embed", "none"]) == {
        "chat": 12.0,
        "embed": 0.0,
        "none": 0.0,
    }
    assert rates.per_deployment(["a"], ["chat"]) == {"chat": 10.0}


def test_the_router_counter_is_read_per_deployment_over_every_status():
    r = CollectorRegistry()
    c = Counter("gpufleet_router_requests", "", ["deployment", "code"], registry=r)
    c.labels("chat", "200").inc(7)
    c.labels("chat", "503").inc(2)
    c.labels("embed", "200").inc(1)
    Counter("gpufleet_router_requests_other", "", ["deployment"], registry=r).labels("chat").inc(50)
    assert requests_by_deployment(generate_latest(r).decode()) == {"chat": 9.0, "embed": 1.0}
