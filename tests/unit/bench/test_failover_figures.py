"""The failover bench's figures from request records, its HAProxy configuration and its
headline verdict: pure functions, no processes."""

from __future__ import annotations

import math

import pytest

from bench.failover import Fault, Geo, headline
from bench.support import traffic
from bench.support.haproxy import render_config
from bench.support.traffic import Outcome


def out(start: float, e2e: float, plane: str, *, ok: bool = True, stream: bool = False,
        cut: bool = False, ttft: float = 0.01) -> Outcome:  # fmt: skip
    return Outcome(start, stream, 200 if ok or cut else 0, ok, cut, ttft, e2e, plane)


def test_a_stream_is_cut_when_it_ends_with_neither_done_nor_an_error_event() -> None:
    done = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
    errored = b'data: {"error": {"message": "replica died"}}\n\ndata: [DONE]\n\n'
    assert traffic.classify_stream(200, done) == (True, False)
    assert traffic.classify_stream(200, b'data: {"choices": []}\n\n') == (False, True)
    assert traffic.classify_stream(200, errored) == (False, False)
    assert traffic.classify_stream(503, b"") == (False, False)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert traffic.percentile(values, 99) == 99.0
    assert traffic.percentile(values, 50) == 50.0
    assert traffic.percentile([3.0], 99) == 3.0
    assert math.isnan(traffic.percentile([], 99))


def test_failed_counts_cut_streams_and_busiest_counts_only_successes() -> None:
    records = [out(0, 1, "a"), out(0, 1, "a", ok=False), out(0, 1, "b", ok=False, cut=True,
               stream=True), out(0, 1, "b"), out(0, 1, "b")]  # fmt: skip
    assert traffic.failed(records) == 2
    assert traffic.cut(records) == 1
    assert traffic.served_by(records) == {"a": 1, "b": 2}
    assert traffic.busiest(records) == "b"


def test_far_requests_count_only_while_the_near_plane_had_two_free_slots() -> None:
    near = [out(0.0, 1.0, "near") for _ in range(3)]  # 3 in flight from 0 to 1 s
    far_busy = out(0.5, 0.2, "far")  # near: 3 of capacity 4 in flight, one free slot
    far_free = out(1.5, 0.2, "far")  # near idle
    far_early = out(1.2, 0.2, "far")
    records = [*near, far_busy, far_free, far_early]
    assert traffic.in_flight_at(records, "near", 0.5) == 3
    assert traffic.sent_far_with_headroom(records, "far", "near", 4) == 2
    assert traffic.sent_far_with_headroom(records, "far", "near", 4, since=1.3) == 1
    assert traffic.sent_far_with_headroom(records, "far", "near", 5) == 3


def test_the_haproxy_peer_is_configured_as_a_careful_user_would() -> None:
    cfg = render_config(8400, [("a", 9001), ("b", 9002)])
    for line in ("option httpchk GET /health", "retries 3", "option redispatch",
                 "observe layer7", "inter 1s", "balance roundrobin", "option http-no-delay",
                 "retry-on all-retryable-errors", "bind 127.0.0.1:8400",
                 "server a 127.0.0.1:9001 check", "server b 127.0.0.1:9002 check",
                 "x-gpufleet-plane %[srv_name]"):  # fmt: skip
        assert line in cfg
    assert "balance leastconn" in render_config(1, [("a", 2)], "leastconn")


def good_run() -> tuple[dict[str, float], dict[str, Fault], dict[str, Fault], dict[str, Geo]]:
    ok = Fault(failed=0, cut=0, total=700, shift_s=0.1, p99_s=0.5, victim="a")
    theirs = Fault(failed=5, cut=5, total=700, shift_s=3.0, p99_s=10.0, victim="a")
    geos = {"gateway": Geo(0.12, {"near": 10}, 0, 0),
            "round-robin": Geo(0.2, {"near": 5}, 5, 0),
            "nearest only": Geo(3.0, {"": 10}, 0, 0)}  # fmt: skip
    return ({"gateway": 0.001, "haproxy": 0.001},
            {"gateway": ok, "haproxy": theirs}, {"gateway": ok, "haproxy": theirs}, geos)  # fmt: skip


def test_headline_passes_only_when_every_target_is_met(capsys: pytest.CaptureFixture[str]) -> None:
    added, kills, hangs, geos = good_run()
    assert headline(added, kills, hangs, geos) == 0
    assert capsys.readouterr().out.strip().endswith("PASS")
    worse = [
        ({**added, "gateway": 0.0013}, kills, hangs, geos),
        (added, {**kills, "gateway": Fault(1, 0, 700, 0.1, 0.5, "a")}, hangs, geos),
        (added, kills, {**hangs, "gateway": Fault(0, 1, 700, 0.1, 0.5, "a")}, geos),
        (added, kills, {**hangs, "gateway": Fault(0, 0, 700, 1.5, 0.5, "a")}, geos),
        (added, kills, hangs, {**geos, "gateway": Geo(0.25, {}, 0, 0)}),
        (added, kills, hangs, {**geos, "gateway": Geo(0.12, {}, 1, 0)}),
        (added, kills, hangs, {**geos, "gateway": Geo(0.12, {}, 0, 3)}),  # failed requests
        # a peer that answered no stream is not beaten
        (added, kills, hangs, {**geos, "round-robin": Geo(float("inf"), {}, 0, 700)}),
        (added, kills, hangs, {**geos, "nearest only": Geo(float("nan"), {}, 0, 0)}),
    ]
    for case in worse:
        assert headline(*case) == 1
        assert capsys.readouterr().out.strip().endswith("FAIL")


def test_headline_fails_without_a_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    _, kills, hangs, geos = good_run()
    del geos["gateway"]
    assert headline({"haproxy": 0.001}, kills, hangs, geos) == 1
    assert "gateway not available" in capsys.readouterr().out


def test_failures_say_what_the_failed_requests_got() -> None:
    records = [
        out(0, 1, "a"),
        Outcome(0, False, 502, False, False, 0.1, 0.1, "a"),
        Outcome(0, False, 502, False, False, 0.1, 0.1, "a"),
        Outcome(0, True, 200, False, True, 0.1, 0.1, "a", "UpstreamError"),
        Outcome(0, True, 200, False, False, 0.1, 0.1, "a"),
        Outcome(0, False, 0, False, False, math.inf, 30.0, "", "TimeoutError"),
    ]
    assert traffic.failures(records) == (
        "2 x 502 bad body, 1 x 200 UpstreamError, 1 x 200 error event, 1 x TimeoutError"
    )
    assert traffic.failures(records[:1]) == ""
