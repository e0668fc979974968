"""Where a gateway's traffic goes on the map: its per-plane counts as lines whose width follows
the share (pure; the counts come from the real gateway metrics' exposition)."""

from __future__ import annotations

from prometheus_client import generate_latest

from controlplane.dashboard.traffic import (
    MAX_WIDTH,
    MIN_WIDTH,
    arc,
    flows,
    gateway_point,
    requests_by_plane,
)
from workloadplane.gateway.state import GatewayMetrics


def gateway_text(sent: dict[tuple[str, str, str], int]) -> str:
    metrics = GatewayMetrics()
    for (deployment, plane, code), n in sent.items():
        metrics.requests.labels(deployment, plane, code).inc(n)
    return generate_latest(metrics.registry).decode()


def test_the_gateway_counter_is_summed_per_plane_and_refusals_without_a_plane_left_out():
    text = gateway_text(
        {
            ("chat", "use1-a", "200"): 6,
            ("embed", "use1-a", "200"): 2,
            ("chat", "euc1-a", "502"): 2,
            ("chat", "", "429"): 40,
        }
    )
    assert requests_by_plane(text) == {"use1-a": 8.0, "euc1-a": 2.0}
    assert requests_by_plane(gateway_text({})) == {}


def test_lines_go_from_the_gateway_to_each_plane_as_wide_as_its_share():
    planes = {"use1-a": (280.0, 130.0), "euc1-a": (504.0, 106.0)}
    drawn = flows((281.0, 131.0), {"use1-a": 8, "euc1-a": 2}, planes)
    assert [(f.plane, f.requests, f.share) for f in drawn] == [
        ("use1-a", 8, 0.8),
        ("euc1-a", 2, 0.2),
    ]
    assert drawn[0].width > drawn[1].width >= MIN_WIDTH
    assert drawn[0].start == (281.0, 131.0) and drawn[1].end == (504.0, 106.0)
    alone = flows((0.0, 0.0), {"use1-a": 5}, planes)
    assert alone[0].width == MAX_WIDTH


def test_no_traffic_draws_nothing_and_an_unknown_plane_still_counts_in_the_shares():
    planes = {"use1-a": (1.0, 1.0)}
    assert flows((0.0, 0.0), {}, planes) == []
    assert flows((0.0, 0.0), {"use1-a": 0}, planes) == []
    drawn = flows((0.0, 0.0), {"use1-a": 1, "gone": 3}, planes)
    assert [(f.plane, f.share) for f in drawn] == [("use1-a", 0.25)]


def test_a_gateway_sits_below_its_region_and_its_lines_bow_to_one_side():
    assert gateway_point((100.0, 100.0)) == (100.0, 130.0)  # a cluster there stays visible
    assert arc((0.0, 0.0), (100.0, 0.0)) == "M0,0Q50,20 100,0"
    assert arc((100.0, 0.0), (0.0, 0.0)) == "M100,0Q50,-20 0,0"  # the way back bows apart
    drawn = flows((0.0, 0.0), {"use1-a": 1}, {"use1-a": (100.0, 0.0)})
    assert drawn[0].path == "M0,0Q50,20 100,0"
