"""A deployment's serving figures from router /metrics texts (pure parsing and quantiles)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from controlplane.dashboard.routermetrics import quantile, serving


def test_the_quantile_interpolates_inside_its_bucket_like_prometheus():
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == 0.1
    assert abs((quantile(0.7, buckets) or 0) - 0.3) < 1e-9
    assert quantile(0.99, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.99, [(1.0, 0.0), (float("inf"), 5.0)]) == 1.0  # all above the last bound


def router_text(requests: dict[str, int], ttfts: list[float]) -> str:
    r = CollectorRegistry()
    c = Counter("gpufleet_router_requests", "", ["deployment", "code"], registry=r)
    h = Histogram(
        "gpufleet_router_time_to_first_token_seconds", "", ["deployment"],
        buckets=(0.05, 0.1, 0.5, 1.0), registry=r,
    )  # fmt: skip
    for code, n in requests.items():
        c.labels("chat", code).inc(n)
    c.labels("other", "200").inc(7)
    for t in ttfts:
        h.labels("chat").observe(t)
    return generate_latest(r).decode()


def test_figures_are_summed_over_routers_for_one_deployment_only():
    a = router_text({"200": 3, "503": 1}, [0.04, 0.04, 0.3])
    b = router_text({"200": 2}, [0.04])
    got = serving([a, b], "chat")
    assert got is not None
    assert (got.requests, got.errors) == (6, 1)
    assert got.ttft_mean_s is not None and abs(got.ttft_mean_s - 0.105) < 1e-9
    assert got.ttft_p99_s is not None and 0.1 < got.ttft_p99_s <= 0.5
    assert got.tokens_per_s_mean is None  # no such histogram in these texts


def test_a_deployment_no_router_serves_has_no_figures():
    assert serving([router_text({"200": 1}, [])], "nobody") is None
    assert serving([], "chat") is None
