"""The gateway against real planes (engine-sim replicas behind real plane routers), real
NATS and real gateway processes: routing and why, active-active failover (killed and hung
plane), missed load reports, residency under failover, forged messages, mid-stream
failover, gateway HA and static stability (NATS down, restart with NATS down)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from controlplane.contracts import (
    DeploymentLoad,
    DeploymentRoute,
    PlaneLoad,
    encode,
    plane_load_subject,
)
from tests.integration.gateway.conftest import Fleet, chat, wait_until
from tests.integration.gateway.netns import PlaneNetwork


@dataclass
class Load:
    """Closed-loop clients against one gateway: (start, plane, status) per request."""

    url: str
    workers: int = 4
    body: dict = field(default_factory=chat)
    headers: dict = field(default_factory=dict)
    results: list[tuple[float, str, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    r = client.post(f"{self.url}/v1/chat/completions", json=self.body,
                                    headers=self.headers)  # fmt: skip
                    self.results.append((began, r.headers.get("x-gpufleet-plane", ""),
                                         r.status_code, r.text[:4000]))  # fmt: skip
                except httpx.HTTPError as exc:
                    self.results.append((began, "", 0, repr(exc)))

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._run) for _ in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def failed(self) -> list[tuple[float, str, int, str]]:
        return [r for r in self.results if r[2] != 200]

    def last_sent_to(self, plane: str) -> float:
        return max((r[0] for r in self.results if r[1] == plane), default=float("-inf"))


def post(fleet: Fleet, gateway: str = "g1", **headers: str) -> httpx.Response:
    return httpx.post(f"{fleet.url(gateway)}/v1/chat/completions", json=chat(), timeout=10,
                      headers=headers)  # fmt: skip


def test_routes_to_the_nearest_plane_and_says_why(fleet: Fleet):
    # every plane in rotation, warm (a ready replica: the fleet may have just started, and a
    # cold plane rightly pays the cold-start penalty) and none ramping back (a plane
    # readmitted after a late probe on a loaded machine takes 10 % of its capacity at first,
    # so it can look saturated): then the nearest one is the choice, for the ranking's reason
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})

    def settled() -> bool:
        ranking = fleet.routes("g1", "chat")["ranking"]
        return [r["plane"] for r in ranking][:1] == ["a"] and not any(
            r["saturated"] or r["cold_ms"] > 0 for r in ranking
        )

    # the ranking can change between the look and the request (a probe, a load report on a
    # loaded machine): the precondition is looked at again, up to 3 times, not the result
    for _ in range(3):
        wait_until(settled, 60, "a first at g1, every plane warm and unsaturated")
        answer = post(fleet)
        if answer.headers.get("x-gpufleet-plane") == "a":
            break
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-gpufleet-plane"] == "a", answer.headers["x-gpufleet-route"]
    assert "expected ttft" in answer.headers["x-gpufleet-route"]
    assert answer.headers["x-request-id"]

    def de_first() -> bool:  # for a client in eu-central, as the precondition above
        ranking = fleet.routes("g1", "chat", region="eu-central")["ranking"]
        return [r["plane"] for r in ranking][:1] == ["de"] and not any(
            r["saturated"] or r["cold_ms"] > 0 for r in ranking
        )

    for _ in range(3):
        wait_until(de_first, 60, "de first at g1 for eu-central, every plane warm")
        eu = post(fleet, **{"x-gpufleet-client-region": "eu-central"})
        if eu.headers.get("x-gpufleet-plane") == "de":
            break
    assert eu.headers["x-gpufleet-plane"] == "de", eu.headers["x-gpufleet-route"]
    assert fleet.ranked("g2", "chat")[0] == "de"
    missing = httpx.post(f"{fleet.url('g1')}/v1/chat/completions", json={"model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    bad = httpx.post(f"{fleet.url('g1')}/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    deep = b'{"model": "chat", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    nested = httpx.post(f"{fleet.url('g1')}/v1/chat/completions", content=deep)
    assert nested.status_code == 400 and nested.json()["error"]["code"] == "invalid_json"
    assert "nested too deeply" in nested.json()["error"]["message"]
    # a body over the gateway's limit (16 MiB by default) is refused with the gateway's
    # own option named, not the router's (the HTTP server is shared)
    big = chat() | {"messages": [{"role": "user", "content": "x" * (17 * 1024 * 1024)}]}
    large = httpx.post(f"{fleet.url('g1')}/v1/chat/completions", json=big, timeout=30)
    assert large.status_code == 413 and large.json()["error"]["code"] == "request_too_large"
    message = large.json()["error"]["message"]
    assert "this gateway's limit of 16 MiB" in message, message
    assert "gateway's --max-body-bytes" in message, message


def _failovers(fleet: Fleet) -> float:
    """g1's requests moved off a plane so far (each one an attempt there that failed)."""
    lines = fleet.metrics("g1").splitlines()
    return sum(
        float(x.split()[-1]) for x in lines if x.startswith("gpufleet_gateway_failovers_total")
    )


def _out_of_rotation(
    fleet: Fleet, plane: str, fault: Callable[[], None]
) -> tuple[float, int, float]:
    """Under load through g1, ``fault`` hits ``plane``: nothing fails, it is out within a
    second, and no request is tried there once it is out. Returns the seconds to out, the
    requests answered and how many of them moved off the plane."""
    with Load(fleet.url("g1")) as load:
        time.sleep(0.5)
        before = _failovers(fleet)
        killed = time.monotonic()
        fault()
        gone = wait_until(lambda: plane not in fleet.ranked("g1", "chat"), 5, f"{plane} out")
        moved = _failovers(fleet)
        time.sleep(1.0)
    assert load.failed() == [], load.failed()[:3]
    assert len(load.results) > 20
    assert gone - killed <= 1.0, gone - killed
    assert load.last_sent_to(plane) - killed <= 1.0
    assert {r[1] for r in load.results if r[0] > killed + 1.0} <= {"b", "de"}
    assert _failovers(fleet) == moved  # nothing tried on it since it went out
    return gone - killed, len(load.results), moved - before


def test_a_killed_plane_loses_no_request_and_is_out_within_a_second(fleet: Fleet):
    try:
        _out_of_rotation(fleet, "a", lambda: fleet.signal("router-a", signal.SIGKILL))
    finally:
        fleet.restart("router-a")
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_a_hung_plane_loses_no_request_and_is_out_within_a_second(fleet: Fleet):
    try:
        _out_of_rotation(fleet, "a", lambda: fleet.signal("router-a", signal.SIGSTOP))
    finally:
        fleet.signal("router-a", signal.SIGCONT)
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def _why_out(fleet: Fleet, plane: str, model: str = "chat") -> str:
    """Why g1 leaves ``plane`` out of ``model``'s ranking now ("": it does not)."""
    return "; ".join(e["why"] for e in fleet.routes("g1", model)["excluded"] if e["plane"] == plane)


def test_a_cut_plane_loses_no_request_and_is_out_within_a_second(
    fleet: Fleet, cut_plane: PlaneNetwork
):
    """Plane n's network is cut under load (every packet lost, nothing refused: no RST, no
    ICMP), so only the gateway's own timeouts — its requests' and its probes' — can tell.
    Then the network comes back, and so does n's traffic."""
    out, answered, moved = _out_of_rotation(fleet, "n", lambda: cut_plane.cut("data", "bus"))
    why = _why_out(fleet, "n")
    assert why.startswith("ejected: "), why  # by its own outcomes
    assert moved >= 1  # the requests it held went to the next plane
    cut_plane.restore("data", "bus")
    restored = time.monotonic()
    with Load(fleet.url("g1")) as load:
        back = wait_until(lambda: load.last_sent_to("n") > restored, 20, "n to serve again")
    assert load.failed() == [], load.failed()[:3]
    print(
        f"cut plane: out after {out:.2f}s, {answered} answered, {moved:.0f} moved off it, "
        f"0 failed ({why}); serving again {back - restored:.2f}s after the network came back"
    )


def test_a_plane_cut_off_from_nats_is_out_within_three_seconds(
    fleet: Fleet, cut_plane: PlaneNetwork
):
    """Only n's link to NATS is cut: its router answers every probe, its load reports stop.
    With no traffic at all, g1 takes it out for the missing reports within 3 s of the cut."""
    cut = time.monotonic()
    cut_plane.cut("bus")
    out = wait_until(lambda: "no load report" in _why_out(fleet, "n"), 5, "n out, unheard")
    assert out - cut <= 3.0, out - cut
    cut_plane.restore("bus")
    restored = time.monotonic()
    back = wait_until(lambda: "n" in fleet.ranked("g1", "chat"), 20, "n heard again")
    print(f"cut from NATS: out after {out - cut:.2f}s; back {back - restored:.2f}s after")


def test_a_plane_whose_load_reports_stop_is_out_within_three_seconds(fleet: Fleet):
    """Plane c (b's router under another name, so its probes pass) reports only what this
    test publishes for it; when the reports stop, c is out within 3 s (and not before the
    2 s staleness), while its router still answers."""
    table = fleet.table()
    b = table.deployments[0].planes[1]
    c = b.model_copy(update={"cluster": "c"})
    side = DeploymentRoute(name="side", planes=[c])
    fleet.put_table(table.model_copy(update={"deployments": [*table.deployments, side]}))
    report = PlaneLoad(cluster="c", source="cluster/c",
                       deployments=[DeploymentLoad(name="side", ready_replicas=1, capacity=8)])  # fmt: skip

    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            fleet.publish(plane_load_subject("c"), encode(report))
            time.sleep(0.2)
        fleet.publish(plane_load_subject("c"), encode(report))
        stopped = time.monotonic()
        assert fleet.ranked("g1", "side") == ["c"]
        out = wait_until(lambda: "no load report" in _why_out(fleet, "c", "side"), 5,
                         "c out for missing reports")  # fmt: skip
        assert 1.5 <= out - stopped <= 3.0, out - stopped
    finally:
        fleet.put_table(fleet.table())


def test_active_passive_fails_over_to_the_standby_and_back_after_hold_down(fleet: Fleet):
    table = fleet.table()
    a, b = table.deployments[0].planes[:2]
    ap = DeploymentRoute(name="chat", failover="active_passive", hold_down_seconds=3.0,
                         planes=[a, b.model_copy(update={"role": "standby"})])  # fmt: skip
    fleet.put_table(table.model_copy(update={"deployments": [ap]}))
    body = chat()

    def served_by() -> str:
        r = httpx.post(f"{fleet.url('g1')}/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 200, r.text
        return r.headers["x-gpufleet-plane"]

    try:
        wait_until(lambda: fleet.ranked("g1", "chat") == ["a"], 10, "chat on its active plane")
        assert served_by() == "a"
        fleet.kill("router-a")
        assert served_by() == "b"  # the standby, at once: nothing failed
        assert "standby" in fleet.routes("g1", "chat")["ranking"][0]["why"]
        fleet.restart("router-a")
        back = wait_until(lambda: "hold-down" in str(fleet.routes("g1", "chat")["excluded"]),
                          10, "a healthy again, held down")  # fmt: skip
        assert served_by() == "b"  # held down: no flapping
        returned = wait_until(lambda: fleet.ranked("g1", "chat") == ["a"], 10, "back to a")
        assert returned - back >= 2.0
        assert served_by() == "a"
    finally:
        fleet.put_table(fleet.table())
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_residency_holds_under_failover(fleet: Fleet):
    de = {"x-gpufleet-jurisdiction": "DE"}
    assert post(fleet, **de).headers["x-gpufleet-plane"] == "de"
    try:
        with Load(fleet.url("g1"), headers=de, workers=2) as load:
            time.sleep(0.3)
            fleet.kill("router-de")
            time.sleep(1.5)
        assert {r[1] for r in load.results} <= {"de", ""}  # never a US plane
        refused = [r for r in load.results if r[2] == 503]
        assert refused and "DE" in json.loads(refused[-1][3])["error"]["message"]
        assert {r[2] for r in load.results} <= {200, 503}
    finally:
        fleet.restart("router-de")
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_forged_and_malformed_messages_are_rejected_and_counted(fleet: Fleet):
    forged = PlaneLoad(cluster="b", source="cluster/b",
                       deployments=[DeploymentLoad(name="chat", in_flight=999)])  # fmt: skip
    fleet.publish(plane_load_subject("a"), encode(forged))  # a claims to be b
    fleet.put_table(raw=b"{not a table")
    # nested past the JSON parser's recursion limit (a RecursionError escaped before)
    fleet.publish(plane_load_subject("a"), b"[" * 100_000 + b"]" * 100_000)
    wait_until(lambda: 'reason="forged"' in fleet.metrics("g1"), 5, "the forged report counted")
    wait_until(
        lambda: 'kind="plane_load",reason="malformed"' in fleet.metrics("g1"),
        5,
        "the over-deep report counted",
    )
    text = fleet.metrics("g1")
    assert 'kind="routing_table",reason="malformed"' in text
    assert post(fleet).status_code == 200  # still routing from the last good table


def _stream(
    url: str, body: dict, on_chunk=None, headers: dict[str, str] | None = None
) -> tuple[str, list[str], dict | None]:
    """(text, raw data lines, usage) of one SSE stream."""
    text, lines, usage = [], [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30,
                      headers=headers) as r:  # fmt: skip
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                text.append(choice["delta"].get("content") or "")
            if on_chunk is not None:
                on_chunk(len(text))
    return "".join(text), lines, usage


@pytest.mark.parametrize("dies", ["router", "sim"])
def test_a_stream_continues_on_another_plane_when_its_plane_dies(fleet: Fleet, dies: str):
    """The plane's router killed (the connection drops), or its only replica (the router
    ends the stream with its own error event): either way one whole stream reaches the
    client."""
    body = chat(max_tokens=60, stream=True, ignore_eos=True,
                stream_options={"include_usage": True})  # fmt: skip
    reference, _, ref_usage = _stream(f"http://127.0.0.1:{fleet.ports['router-b']}", body)
    killed = []

    def kill_midway(chunks: int) -> None:
        if chunks == 15 and not killed:
            killed.append(time.monotonic())
            fleet.kill(f"{dies}-a")

    try:
        text, lines, usage = _stream(fleet.url("g1"), body, kill_midway)
    finally:
        fleet.restart(f"{dies}-a")
    assert killed, "the stream ended before the plane was killed"
    assert text == reference
    assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
    assert usage is not None and ref_usage is not None
    assert usage["completion_tokens"] == ref_usage["completion_tokens"] == 60
    assert usage["prompt_tokens"] == ref_usage["prompt_tokens"]
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_a_continued_stream_outlives_a_stall_of_the_plane_it_moved_to(fleet: Fleet):
    """Plane a dies mid-stream and the stream moves to b; then b stalls for 1.6 s (SIGSTOP,
    as a router starved on a loaded machine): the gateway's probes take b out, but no other
    plane may take the stream (a is dead, de is outside the US), so it is not cut: it
    resumes on b's connection, whole, and keeps its moves."""
    body = chat(max_tokens=80, stream=True, ignore_eos=True,
                stream_options={"include_usage": True})  # fmt: skip
    reference, _, _ = _stream(f"http://127.0.0.1:{fleet.ports['router-b']}", body)
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})
    faults: list[str] = []
    resume = threading.Timer(1.6, lambda: fleet.signal("router-b", signal.SIGCONT))

    def fault_midway(chunks: int) -> None:
        if chunks == 10 and not faults:
            faults.append("a killed")
            fleet.kill("router-a")
        elif chunks == 20 and len(faults) == 1:  # now flowing from b
            faults.append("b stopped")
            fleet.signal("router-b", signal.SIGSTOP)
            resume.start()

    try:
        text, lines, usage = _stream(fleet.url("g1"), body, fault_midway,
                                     {"x-gpufleet-jurisdiction": "US"})  # fmt: skip
    finally:
        resume.cancel()
        fleet.signal("router-b", signal.SIGCONT)
        fleet.restart("router-a")
    assert faults == ["a killed", "b stopped"], faults
    assert text == reference
    assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
    assert usage is not None and usage["completion_tokens"] == 80
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_killing_one_gateway_leaves_the_other_serving(fleet: Fleet):
    try:
        fleet.kill("g1")
        with Load(fleet.url("g2"), workers=2) as load:
            time.sleep(1.0)
        assert load.results and load.failed() == []
    finally:
        fleet.restart("g1")
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_static_stability_nats_down_and_restart_with_nats_down(fleet: Fleet):
    fleet.nats.stop()
    try:
        time.sleep(3.0)  # longer than a load report's staleness: must not matter now
        assert post(fleet).status_code == 200
        fleet.restart("g1")  # its table comes from disk
        answer = post(fleet)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-gpufleet-plane"] == "a"
    finally:
        fleet.nats.start()
    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})


def test_answers_to_clients_in_another_region_are_counted_as_data_transfer(fleet: Fleet):
    """The plane's router counts the bytes of every answer, and apart those a gateway sends
    on to a client in another region (the cost ledger's data transfer, docs/cost.md); a
    client cannot set that header itself."""

    def usage(plane: str) -> dict:
        load = httpx.get(f"{fleet.url(f'router-{plane}')}/internal/load", timeout=5).json()
        return load["usage"].get("chat", {"response_bytes": 0, "cross_region_bytes": 0})

    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})
    before = {p: usage(p) for p in ("a", "b", "de")}
    # from eu-central but held to US planes: the answer crosses regions
    far = post(fleet, **{"x-gpufleet-client-region": "eu-central",
                         "x-gpufleet-jurisdiction": "US"})  # fmt: skip
    assert far.status_code == 200, far.text
    served = far.headers["x-gpufleet-plane"]
    assert served in ("a", "b")
    # from the plane's own region, claiming to cross: not counted (held to DE, so the answer
    # is de's even when a loaded machine has just made g2 rank a US plane first)
    near = post(fleet, "g2", **{"x-gpufleet-cross-region": "1",
                                "x-gpufleet-jurisdiction": "DE"})  # fmt: skip
    assert near.status_code == 200 and near.headers["x-gpufleet-plane"] == "de"
    after = {p: usage(p) for p in ("a", "b", "de")}
    crossed = after[served]["cross_region_bytes"] - before[served]["cross_region_bytes"]
    assert crossed == after[served]["response_bytes"] - before[served]["response_bytes"] > 0
    assert after["de"]["cross_region_bytes"] == before["de"]["cross_region_bytes"]
    assert after["de"]["response_bytes"] > before["de"]["response_bytes"]


def test_the_gateway_measures_sizes_and_times_per_deployment_and_plane(fleet: Fleet):
    def samples() -> dict[str, float]:
        out = {}
        for line in fleet.metrics("g1").splitlines():
            if line.startswith("gpufleet_gateway_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    fleet.wait_ranked("g1", "chat", {"a", "b", "de"})
    before = samples()
    answer = post(fleet)
    assert answer.status_code == 200, answer.text
    plane = answer.headers["x-gpufleet-plane"]
    after = samples()
    labels = f'{{deployment="chat",plane="{plane}"}}'

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew(f"gpufleet_gateway_request_duration_seconds_count{labels}") == 1
    assert grew(f"gpufleet_gateway_time_to_response_head_seconds_count{labels}") == 1
    assert grew(f"gpufleet_gateway_response_size_bytes_sum{labels}") == len(answer.content)
    assert grew('gpufleet_gateway_request_size_bytes_count{deployment="chat"}') == 1
    head = grew(f"gpufleet_gateway_time_to_response_head_seconds_sum{labels}")
    assert 0 < head <= grew(f"gpufleet_gateway_request_duration_seconds_sum{labels}")
