"""The load-test tool's pure parts: when requests go out per profile, what they are, and how
the outcomes are summarised (docs/loadtest.md)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math

import pytest

from workloadplane.loadtest.profiles import (
    ABNORMAL,
    BURST_FACTOR,
    BURST_PERIOD_S,
    BURST_S,
    LoadTestError,
    Plan,
    arrivals,
    request,
)
from workloadplane.loadtest.report import (
    Outcome,
    per_second,
    render_html,
    render_text,
    summarise,
)
from workloadplane.loadtest.runner import run, target


def test_steady_sends_rate_times_duration_evenly_spaced() -> None:
    times = arrivals(Plan("steady", "m", 20, 10))
    assert len(times) == 200
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) == pytest.approx(0.05, abs=0.0015) and max(gaps) == pytest.approx(
        0.05, abs=0.0015
    )


def test_diurnal_is_quiet_at_night_and_busy_at_noon() -> None:
    plan = Plan("diurnal", "m", 40, 100)
    times = arrivals(plan)
    assert len(times) == pytest.approx(0.55 * 40 * 100, rel=0.02)
    night = sum(1 for t in times if t < 10)
    noon = sum(1 for t in times if 45 <= t < 55)
    assert noon > 4 * night, (night, noon)


def test_burst_multiplies_the_rate_in_each_burst_window() -> None:
    plan = Plan("burst", "m", 10, 30)
    times = arrivals(plan)
    in_burst = [t for t in times if t % BURST_PERIOD_S >= BURST_PERIOD_S - BURST_S]
    base = len(times) - len(in_burst)
    bursts = 30 / BURST_PERIOD_S
    assert len(in_burst) == pytest.approx(bursts * BURST_S * 10 * BURST_FACTOR, rel=0.05)
    assert base == pytest.approx(bursts * (BURST_PERIOD_S - BURST_S) * 10, rel=0.05)


def test_a_stream_share_of_a_half_streams_every_other_request() -> None:
    plan = Plan("steady", "m", 10, 10, stream_share=0.5)
    streams = [request(plan, i).stream for i in range(100)]
    assert sum(streams) == 50 and streams[:4] in ([False, True] * 2, [True, False] * 2)
    assert not any(
        request(Plan("steady", "m", 10, 10, stream_share=0), i).stream for i in range(20)
    )


def test_abnormal_sends_every_kind_in_turn_and_keeps_three_in_four_normal() -> None:
    plan = Plan("abnormal", "llama", 10, 10)
    sent = [request(plan, i) for i in range(4 * len(ABNORMAL))]
    assert [r.kind for r in sent if r.abnormal] == list(ABNORMAL)
    assert sum(1 for r in sent if not r.abnormal) == 3 * len(ABNORMAL)
    by_kind = {r.kind: r for r in sent}
    with pytest.raises(json.JSONDecodeError):
        json.loads(by_kind["bad_json"].body)
    assert json.loads(by_kind["unknown_model"].body)["model"] != "llama"
    assert json.loads(by_kind["bad_temperature"].body)["temperature"] < 0
    assert len(by_kind["prompt_too_long"].body) > 200_000
    assert by_kind["client_goes_away"].stream
    normal = json.loads(sent[0].body)
    assert normal["model"] == "llama" and normal["max_tokens"] == 64


@pytest.mark.parametrize(
    ("plan", "names"),
    [
        (Plan("steady", "m", 0, 10), "--rate"),
        (Plan("steady", "m", 501, 10), "--rate"),
        (Plan("steady", "m", 10, 3601), "--duration"),
        (Plan("steady", "m", 10, 10, max_tokens=0), "--max-tokens"),
        (Plan("steady", "m", 10, 10, stream_share=1.5), "--stream-share"),
        (Plan("steady", "", 10, 10), "deployment"),
        (Plan("burst", "m", 500, 3600), "--rate or --duration"),
    ],
)
def test_out_of_bounds_plans_say_what_to_change(plan: Plan, names: str) -> None:
    with pytest.raises(LoadTestError, match=names):
        plan.check()


def ok(start: float, ttft: float, e2e: float, *, stream: bool = True, tokens: int = 10) -> Outcome:
    return Outcome(start, "normal", stream, 200, True, ttft, e2e, tokens)


def test_summary_percentiles_tokens_and_errors_by_code() -> None:
    outcomes = [ok(i / 10, 0.010 + i / 1000, 0.100, tokens=16) for i in range(100)]
    outcomes += [
        Outcome(5.0, "normal", False, 503, False, math.inf, 0.002, error="no_capacity"),
        Outcome(5.1, "bad_json", False, 400, False, 0.001, 0.001, error="invalid_json"),
        Outcome(5.2, "normal", True, 0, False, math.inf, 0.001, error="connection refused"),
    ]
    s = summarise(outcomes, 10.0)
    assert (s.sent, s.normal, s.ok, s.normal_failed, s.abnormal, s.abnormal_wrong) == (
        103,
        102,
        100,
        2,
        1,
        0,
    )
    assert s.ttft_ms["p50"] == pytest.approx(59.0) and s.ttft_ms["p99"] == pytest.approx(108.0)
    assert s.e2e_ms["p90"] == pytest.approx(100.0)
    assert s.tokens == 1600 and s.tokens_per_s == pytest.approx(160.0, rel=0.02)
    assert s.by_code["200"] == 100
    assert s.by_code["503 no_capacity"] == 1 and s.by_code["connection refused"] == 1
    assert s.by_code["400 invalid_json"] == 1
    assert not s.passed and "2 normal request(s) failed" in render_text(s, "t")


def test_an_abnormal_request_answered_with_a_5xx_fails_the_run() -> None:
    outcomes = [ok(0, 0.01, 0.1), Outcome(0.5, "empty_messages", False, 500, False, 0.001, 0.001)]
    s = summarise(outcomes, 1.0)
    assert s.abnormal_wrong == 1 and not s.passed
    assert "1 abnormal request(s) got a 5xx" in render_text(s, "t")
    gone = Outcome(0.5, "client_goes_away", True, 0, True, 0.01, 0.02, error="client went away")
    assert summarise([ok(0, 0.01, 0.1), gone], 1.0).passed


def test_ttft_is_over_streams_when_some_streamed() -> None:
    """A plain answer's "first token" is its whole answer: it would hide a slow first token
    behind fast short answers, or a fast one behind long answers."""
    outcomes = [ok(0, 0.005, 0.5), ok(0.1, 0.5, 0.5, stream=False), ok(0.2, 0.5, 0.5, stream=False)]
    assert summarise(outcomes, 1.0).ttft_ms["p99"] == pytest.approx(5.0)
    plain = [ok(0, 0.3, 0.3, stream=False)]
    assert summarise(plain, 1.0).ttft_ms["p50"] == pytest.approx(300.0)


def test_per_second_series_and_a_self_contained_html_report() -> None:
    outcomes = [ok(i / 4, 0.01, 0.1) for i in range(12)]
    outcomes.append(Outcome(2.5, "normal", True, 502, False, math.inf, 0.01))
    seconds = per_second(outcomes, 3.0)
    assert [x.sent for x in seconds] == [4, 4, 5] and [x.failed for x in seconds] == [0, 0, 1]
    page = render_html(summarise(outcomes, 3.0), seconds, "gpufleet loadtest <m>")
    assert page.count("<svg") == 2 and "<script" not in page and "http" not in page
    assert "&lt;m&gt;" in page and "FAIL" in page


def test_only_local_or_private_endpoints_unless_allowed() -> None:
    assert target("http://127.0.0.1:8110", allow_remote=False) == ("127.0.0.1", 8110)
    assert target("http://10.1.2.3:80/v1", allow_remote=False) == ("10.1.2.3", 80)
    with pytest.raises(LoadTestError, match="--allow-remote"):
        target("http://8.8.8.8:80", allow_remote=False)
    assert target("http://8.8.8.8:80", allow_remote=True) == ("8.8.8.8", 80)
    with pytest.raises(LoadTestError, match="https"):
        target("https://127.0.0.1:8110", allow_remote=False)


async def test_requests_due_while_the_in_flight_bound_is_reached_are_counted_not_sent() -> None:
    """An endpoint that accepts and never answers: the first 3 stay open (then time out),
    the rest of a 20/s load is recorded as not sent — never silently skipped."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        outcomes = await run(
            Plan("steady", "m", 20, 0.5), "127.0.0.1", port, timeout_s=1.0, max_in_flight=3
        )
    finally:
        server.close()
        for w in held:
            w.close()
    assert len(outcomes) == 10
    assert [o.kind for o in outcomes[:3]] == ["normal"] * 3
    assert all(o.error == "timed out" for o in outcomes[:3])
    assert [o.kind for o in outcomes[3:]] == ["not_sent"] * 7
    assert summarise(outcomes, 0.5).by_code["not sent (in-flight bound)"] == 7


async def test_an_answer_that_never_ends_is_cut_at_the_bound_not_held_in_memory() -> None:
    """A plain answer that streams without end: cut at MAX_ANSWER_BYTES, counted failed."""

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
        except (ConnectionError, OSError):
            writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    plan = Plan("steady", "m", 1, 1, stream_share=0)
    try:
        (outcome,) = await run(plan, "127.0.0.1", port, timeout_s=20)
    finally:
        server.close()
    assert not outcome.ok and outcome.error == "answer over 4 MiB"
    assert summarise([outcome], 1).by_code == {"200 answer over 4 MiB": 1}
