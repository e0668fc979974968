"""The gateway's state: newest table wins and is persisted (a restart with NATS down routes
from it), bad tables and forged or oversized load reports are dropped and counted; and the
plane's load report as its router builds it."""

from __future__ import annotations

import random
from pathlib import Path

from prometheus_client import generate_latest

from controlplane.contracts import (
    MAX_PLANE_LOAD_BYTES,
    AutoscalingPolicy,
    DeploymentDesired,
    DeploymentLoad,
    DeploymentRoute,
    PlaneLoad,
    PlaneRoute,
    ReplicaQuota,
    ReplicaStatus,
    RevisionSpec,
    RoutingTable,
    encode,
)
from workloadplane.gateway.choice import Context, rank
from workloadplane.gateway.state import Attempt, GatewayState, RoutesStore
from workloadplane.router.core import Router
from workloadplane.router.load import RecentWindow, plane_load


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(generation: int, epoch: int = 0, planes: dict[str, str] | None = None) -> bytes:
    """One deployment ``chat<generation>`` on ``planes`` (cluster → jurisdiction; a in US)."""
    routes = [PlaneRoute(cluster=c, endpoint=f"http://127.0.0.1:{9 + i}", region="r",
                         jurisdiction=j, latitude=0, longitude=0)
              for i, (c, j) in enumerate((planes or {"a": "US"}).items())]  # fmt: skip
    t = RoutingTable(generation=generation, epoch=epoch,
                     deployments=[DeploymentRoute(name=f"chat{generation}", planes=routes)])  # fmt: skip
    return t.model_dump_json().encode()


def rejected(state: GatewayState, kind: str, reason: str) -> float:
    value = state.metrics.registry.get_sample_value(
        "gpufleet_gateway_rejected_messages_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def test_newest_table_wins_and_is_restored_after_a_restart(tmp_path: Path):
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(table(2))
    assert not state.apply_table(table(1))
    assert rejected(state, "routing_table", "older") == 1
    assert state.apply_table(table(1, epoch=1))  # a new epoch wins whatever its generation
    assert not state.apply_table(b"\x00garbage")
    assert rejected(state, "routing_table", "malformed") == 1
    again = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert again.restore() and set(again.routes) == {"chat1"}
    assert set(again.planes) == {"a"}
    state.close()
    again.close()


def _table_with(generation: int, endpoint: str) -> bytes:
    route = PlaneRoute(cluster="a", endpoint=endpoint, region="r", jurisdiction="US",
                       latitude=0, longitude=0)  # fmt: skip
    t = RoutingTable(generation=generation,
                     deployments=[DeploymentRoute(name="chat", planes=[route])])  # fmt: skip
    return t.model_dump_json().encode()


def test_an_endpoint_without_a_port_is_dialled_on_the_schemes_and_a_bad_one_refused_whole(
    tmp_path: Path,
):
    """A URL type writes http://h:80 as http://h/; a port past 65535 cannot be dialled: that
    table is refused as a whole and the gateway routes on from the one it had (a half
    installed one named planes it had no connection pool for: 500s until the next table)."""
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(_table_with(1, "http://router.example/"))
    pool = state.planes["a"].pool
    assert (pool.host, pool.port) == ("router.example", 80)
    assert not state.apply_table(_table_with(2, "http://router.example:99999"))
    assert rejected(state, "routing_table", "bad_endpoint") == 1
    assert state.table is not None and state.table.generation == 1
    assert state.planes["a"].pool is pool and set(state.routes) == {"chat"}
    state.close()


def test_forged_and_oversized_load_reports_are_dropped(tmp_path: Path):
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    state.apply_table(table(1))
    report = PlaneLoad(cluster="a", source="cluster/a", deployments=[DeploymentLoad(name="x")])
    assert state.apply_load("gpufleet.v1.cluster.a.load", encode(report))
    assert not state.apply_load("gpufleet.v1.cluster.b.load", encode(report))
    assert rejected(state, "plane_load", "forged") == 1
    assert not state.apply_load("gpufleet.v1.cluster.a.load", b" " * (MAX_PLANE_LOAD_BYTES + 1))
    assert rejected(state, "plane_load", "oversized") == 1
    state.close()


def test_the_router_reports_its_load_and_recent_ttft():
    router = Router()
    spec = DeploymentDesired(name="chat", spec=RevisionSpec(model_id="m", revision="1"),
                             quota=ReplicaQuota(min=1, max=2),
                             autoscaling=AutoscalingPolicy(target_concurrency=4))  # fmt: skip
    router.set_deployments([spec])
    router.set_replicas([
        ReplicaStatus(replica_id="r1", deployment="chat", revision="1", state="ready",
                      endpoint="http://127.0.0.1:9"),
        ReplicaStatus(replica_id="r2", deployment="chat", revision="1", state="starting",
                      endpoint="http://127.0.0.1:10"),
    ])  # fmt: skip
    window = RecentWindow(window_s=10)
    window.finished("chat", 50.0, 9.0)  # before the window
    for i, ttft in enumerate((0.1, 0.2, 0.3, 0.4)):
        window.finished("chat", 95.0 + i, ttft)
    report = plane_load(router, window, "a", sequence=3, interval_s=0.5, now=100.0)
    (load,) = report.deployments
    assert (load.ready_replicas, load.starting_replicas, load.capacity) == (1, 1, 4)
    assert load.ttft_seconds is not None and abs(load.ttft_seconds - 0.25) < 1e-9
    assert abs(load.service_rate - 4 / 5.0) < 1e-9
    assert report.cluster == "a" and report.source == "cluster/a" and report.sequence == 3
    router.close()


def test_a_late_probe_does_not_cut_a_plane_that_is_streaming_but_one_that_is_silent(
    tmp_path: Path,
):
    """A loaded router may answer /health late while it streams: its streams flow, so it
    stays in rotation and they are not cut. Silent since the probe went out (hung, cut off):
    out, and its streams cut so that they continue elsewhere (b)."""
    clock = Clock()
    state = GatewayState("r", clock, RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US", "b": "US"}))
    cuts: list[str] = []
    plane = state.planes["a"]
    plane.attempts.add(Attempt("chat1", started=True, cut=cuts.append))
    sent = clock.now
    clock.now += 0.3
    plane.last_byte_at = clock.now  # a chunk arrived after the probe was sent
    clock.now += 0.2
    assert not state.probe_failed("a", "health probe: timed out", sent)
    assert cuts == [] and not plane.health.ejected
    sent = clock.now  # the next probe: nothing arrives any more
    clock.now += 0.5
    prefill = Attempt("chat1", started=True, cut=cuts.append, alive_at=clock.now - 0.4)
    plane.attempts.add(prefill)  # its head came 0.4 s ago; its first token is still due
    assert state.probe_failed("a", "health probe: timed out", sent)
    assert len(cuts) == 1 and "stopped answering" in cuts[0]
    assert plane.health.ejected
    plane.attempts = {prefill}  # the cut stream has left (it continues elsewhere)
    clock.now += 0.75  # the next late probe: the new stream is silent for 1.15 s now
    assert not state.probe_failed("a", "health probe: timed out", clock.now - 0.5)
    assert len(cuts) == 2
    state.close()


def test_a_late_probe_leaves_a_silent_stream_that_could_only_come_back_to_its_plane(
    tmp_path: Path,
):
    """A silent stream is cut so that it continues elsewhere: where no other plane may take
    it (the only other one is ejected, or outside the request's residency), the cut would
    only bring it back to the same plane once that answers again and spend one of its moves
    — it is left to resume on its own connection."""
    clock = Clock()
    state = GatewayState("r", clock, RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US", "b": "US", "de": "DE"}))
    cuts: list[str] = []
    for name, asked in (("us", frozenset({"US"})), ("anywhere", frozenset())):
        state.planes["a"].attempts.add(
            Attempt("chat1", asked, started=True, cut=lambda why, n=name: cuts.append(n))
        )
    state.failed("b", "connection refused")  # b is out: de is the only other plane
    clock.now += 2.0
    assert state.probe_failed("a", "health probe: timed out", clock.now - 0.5)
    assert cuts == ["anywhere"]  # de may take it; the US-only stream stays on a
    state.close()


def test_a_last_resort_try_on_an_ejected_plane_that_stays_hung_is_given_up(tmp_path: Path):
    """With no plane in rotation a request is tried anyway on an ejected one; if that one is
    hung (its router stopped: the kernel still takes connections), the try waited until the
    client left. A late probe of that plane now gives up its tries that got no byte."""
    clock = Clock()
    state = GatewayState("r", clock, RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US"}))
    assert state.failed("a", "connection refused")  # out of rotation
    cancels: list[str] = []
    state.planes["a"].attempts.add(Attempt("chat1", cancel=cancels.append))  # tried anyway
    clock.now += 1.0
    assert not state.probe_failed("a", "health probe: timed out", clock.now - 0.5)
    assert len(cancels) == 1 and "stopped answering" in cancels[0]
    started = Attempt("chat1", started=True, cancel=cancels.append)
    state.planes["a"].attempts = {started}  # a try with its head: left to its own deadlines
    state.failed("a", "connection refused")  # refused is not hung: nothing given up
    assert len(cancels) == 1
    state.close()


def _ranked(state: GatewayState, deployment: str = "chat1") -> list[str]:
    choice = state.choose(deployment, None, frozenset())
    assert choice is not None
    return [r.cluster for r in choice.ranked]


def _report(state: GatewayState, cluster: str, **load: object) -> None:
    report = PlaneLoad(cluster=cluster, source=f"cluster/{cluster}",
                       deployments=[DeploymentLoad(name="chat1", **load)])  # type: ignore[arg-type]  # fmt: skip
    assert state.apply_load(f"gpufleet.v1.cluster.{cluster}.load", encode(report))


def test_a_kept_ranking_follows_every_change_of_what_it_was_made_from(tmp_path: Path):
    """The gateway keeps the last ranking per (deployment, region, residency) while nothing
    it was made from changes: the same answer for the next request — and a new one at once
    when a plane's RTT, health, load or this gateway's requests there change, or when the
    clock reaches a report's staleness."""
    clock = Clock()
    state = GatewayState("r", clock, RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US", "b": "US"}))
    state.bus_connected = True
    for c in ("a", "b"):
        _report(state, c, ready_replicas=1, capacity=1, service_rate=1.0)
    state.probe_ok("a", 0.010)
    state.probe_ok("b", 0.020)
    first = state.choose("chat1", None, frozenset())
    assert first is not None and [r.cluster for r in first.ranked] == ["a", "b"]
    clock.now += 0.5
    assert state.choose("chat1", None, frozenset()) is first  # nothing changed: kept
    state.planes["a"].rtt_s = 0.030  # a probe measured a slower a
    assert _ranked(state) == ["b", "a"]
    state.planes["a"].rtt_s = 0.010
    assert _ranked(state) == ["a", "b"]
    held = Attempt("chat1")
    state.planes["a"].attempts.add(held)  # a is full (capacity 1): spill over to b
    assert _ranked(state) == ["b", "a"]
    state.planes["a"].attempts.discard(held)
    assert _ranked(state) == ["a", "b"]
    _report(state, "a", ready_replicas=1, capacity=1, in_flight=1, service_rate=1.0)
    assert _ranked(state) == ["b", "a"]  # a's own report: full
    _report(state, "a", ready_replicas=1, capacity=1, service_rate=1.0)
    assert _ranked(state) == ["a", "b"]
    state.failed("a", "connection refused")
    assert _ranked(state) == ["b"]
    state.probe_ok("a", 0.010)
    state.probe_ok("a", 0.010)  # back, ramping up: not kept while its capacity grows
    clock.now += state.params.ramp_s
    assert _ranked(state) == ["a", "b"]
    _report(state, "b", ready_replicas=1, capacity=1, service_rate=1.0)
    clock.now += state.params.load_stale_s  # a's last report is now too old, b's is not
    choice = state.choose("chat1", None, frozenset())
    assert choice is not None and [r.cluster for r in choice.ranked] == ["b"]
    assert "no load report for" in dict(choice.excluded)["a"]
    state.close()


def test_a_kept_ranking_is_per_client_region_and_residency(tmp_path: Path):
    clock = Clock()
    state = GatewayState("r", clock, RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US", "de": "DE"}))
    anywhere = state.choose("chat1", None, frozenset())
    german = state.choose("chat1", None, frozenset({"DE"}))
    assert anywhere is not None and german is not None
    assert [r.cluster for r in german.ranked] == ["de"]
    assert len(anywhere.ranked) == 2
    assert state.choose("chat1", None, frozenset()) is anywhere
    state.close()


def test_a_kept_ranking_is_always_the_one_ranking_afresh_gives(tmp_path: Path):
    """Random changes of every input, and the clock moving by steps around the report
    staleness, the ramp and the hold-down: each answer equals a fresh ``rank``."""
    rng = random.Random(7)
    clock = Clock()
    state = GatewayState("r", clock, RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US", "b": "US", "de": "DE"}))
    held: list[tuple[str, Attempt]] = []
    for _ in range(3000):
        c = rng.choice(["a", "b", "de"])
        op = rng.randrange(8)
        if op == 0:
            _report(state, c, ready_replicas=rng.randrange(2), capacity=rng.randrange(1, 3),
                    in_flight=rng.randrange(3), service_rate=rng.choice([0.0, 1.0]))  # fmt: skip
        elif op == 1:
            state.probe_ok(c, rng.choice([0.01, 0.02, 0.03]))
        elif op == 2 and rng.random() < 0.3:
            state.failed(c, "connection refused")
        elif op == 3:
            held.append((c, Attempt("chat1")))
            state.planes[c].attempts.add(held[-1][1])
        elif op == 4 and held:
            c, attempt = held.pop(rng.randrange(len(held)))
            state.planes[c].attempts.discard(attempt)
        elif op == 5:
            state.bus_connected = rng.random() < 0.8
        else:
            clock.now += rng.choice([0.0, 0.1, 0.5, 1.0, 2.0, 5.0])
        asked = rng.choice([frozenset(), frozenset({"US"})])
        region = rng.choice([None, "r"])
        got = state.choose("chat1", region, asked)
        now = clock.now
        client = state.regions.get(region or state.region) or state.regions.get(state.region)
        ctx = Context(now=now, client=client, gateway_region=state.region, jurisdictions=asked,
                      reports_flowing=state.reports_flowing(now))  # fmt: skip
        fresh = rank(
            state.routes["chat1"], {n: p.signals() for n, p in state.planes.items()}, ctx,
            state.params,
        )  # fmt: skip
        assert got == fresh
        assert got is not None and [r.why for r in got.ranked] == [r.why for r in fresh.ranked]
    state.close()


def test_series_of_deployments_and_planes_that_left_the_table_leave_the_metrics(tmp_path: Path):
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(table(1, planes={"a": "US", "b": "US"}))
    m = state.metrics
    for plane in ("a", "b"):
        m.served("chat1", plane).head_time.observe(0.1)
        m.answered("chat1", plane, 200).inc()
    m.answered("", "", 404).inc()  # a refusal: no deployment, no plane
    m.ejections.labels("b").inc()

    assert state.apply_table(table(2, planes={"a": "US"}))  # chat2 on a only

    text = generate_latest(m.registry).decode()
    assert 'deployment="chat1"' not in text and 'plane="b"' not in text
    assert 'code="404",deployment="",plane=""' in text
    m.answered("chat2", "a", 200).inc()
    assert (
        m.registry.get_sample_value(
            "gpufleet_gateway_requests_total", {"deployment": "chat2", "plane": "a", "code": "200"}
        )
        == 1.0
    )
    state.close()


def test_an_older_table_the_bucket_keeps_holding_is_taken_as_a_rebuilt_fleets(tmp_path: Path):
    """A control plane rebuilt with a new NATS store numbers its tables from the start
    again; a gateway restored from disk with a higher one dropped every new table for good."""
    from workloadplane.gateway.state import STORED_RESET_READS

    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(table(5000))
    for _ in range(10):  # watch deliveries of an older table never count
        assert not state.apply_table(table(1))
    for _ in range(STORED_RESET_READS - 1):
        assert not state.apply_table(table(1), stored=True)
    assert not state.apply_table(table(2))  # a watch delivery in between changes nothing
    assert state.apply_table(table(1), stored=True)
    assert set(state.routes) == {"chat1"}
    assert state.apply_table(table(2))  # and the new numbering goes on as usual
    state.close()


def test_an_older_table_read_between_newer_ones_is_never_taken(tmp_path: Path):
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(table(10))
    for generation in (9, 8, 9, 7, 9):  # each a different older table: no run of one
        assert not state.apply_table(table(generation), stored=True)
    assert not state.apply_table(table(9), stored=True)  # 9 once more after 7: two in a row
    assert not state.apply_table(table(10), stored=True)  # the bucket agrees again
    assert not state.apply_table(table(9), stored=True)
    assert set(state.routes) == {"chat10"}
    state.close()


def test_a_table_that_cannot_be_persisted_is_still_routed_from(tmp_path: Path, monkeypatch):
    """An OSError saving the table (a full disk) escaped into the resync loop and ended it."""
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(table(1))

    def full(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("workloadplane.gateway.state.os.write", full)
    assert state.apply_table(table(2))
    assert set(state.routes) == {"chat2"}
    monkeypatch.undo()
    again = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert again.restore() and set(again.routes) == {"chat1"}  # the last good file stayed
    state.close()
    again.close()


def test_a_short_write_still_persists_the_whole_table(tmp_path: Path, monkeypatch):
    import os

    real = os.write
    monkeypatch.setattr(
        "workloadplane.gateway.state.os.write", lambda fd, data: real(fd, bytes(data[:7]))
    )
    state = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert state.apply_table(table(3))
    monkeypatch.undo()
    again = GatewayState("r", Clock(), RoutesStore(tmp_path))
    assert again.restore() and set(again.routes) == {"chat3"}
    state.close()
    again.close()
