"""The gateway's pure choice: residency, health, report age, active-passive with hold-down,
least expected TTFT with spill-over, and the ramp after recovery."""

from __future__ import annotations

from controlplane.contracts import DeploymentLoad, DeploymentRoute, PlaneRoute, RegionPoint
from workloadplane.gateway.choice import (
    Choice,
    ChoiceParams,
    Context,
    PlaneSignals,
    allowed_jurisdictions,
    rank,
    zones_between,
)

US_EAST = RegionPoint(name="us-east", latitude=39, longitude=-77, jurisdiction="US")
US_WEST = RegionPoint(name="us-west", latitude=45, longitude=-122, jurisdiction="US")
EU = RegionPoint(name="eu-central", latitude=50, longitude=8.7, jurisdiction="DE")


def plane(cluster: str, where: RegionPoint, role: str = "active") -> PlaneRoute:
    return PlaneRoute(
        cluster=cluster,
        endpoint=f"http://{cluster}:8000",
        region=where.name,
        jurisdiction=where.jurisdiction,
        latitude=where.latitude,
        longitude=where.longitude,
        role=role,  # type: ignore[arg-type]
    )


def route(*planes: PlaneRoute, **kw: object) -> DeploymentRoute:
    return DeploymentRoute(name="chat", planes=list(planes), **kw)  # type: ignore[arg-type]


def load(in_flight: int = 0, capacity: int = 8, queue: int = 0, rate: float = 10.0,
         ready: int = 1) -> DeploymentLoad:  # fmt: skip
    return DeploymentLoad(name="chat", ready_replicas=ready, in_flight=in_flight,
                          queue_depth=queue, capacity=capacity, service_rate=rate)  # fmt: skip


def sig(cluster: str, now: float = 100.0, **kw: object) -> PlaneSignals:
    kw.setdefault("loads", {"chat": load()})
    kw.setdefault("load_at", now - 0.2)
    return PlaneSignals(cluster=cluster, **kw)  # type: ignore[arg-type]


def ctx(client: RegionPoint | None = US_EAST, now: float = 100.0, **kw: object) -> Context:
    return Context(now=now, client=client, gateway_region="us-east", **kw)  # type: ignore[arg-type]


TRIO = route(plane("a", US_EAST), plane("b", US_WEST), plane("de", EU))


def order(choice: Choice) -> list[str]:
    return [r.cluster for r in choice.ranked]


def test_zones_are_longitude_over_15_the_short_way_round():
    assert zones_between(-77, 8.7) == 6
    assert zones_between(170, -170) == 1
    assert zones_between(10, 10) == 0


def test_nearest_plane_with_headroom_first():
    signals = {c: sig(c) for c in ("a", "b", "de")}
    assert order(rank(TRIO, signals, ctx())) == ["a", "b", "de"]
    assert order(rank(TRIO, signals, ctx(client=EU)))[0] == "de"


def test_measured_rtt_replaces_the_model_for_the_gateways_own_region():
    signals = {"a": sig("a", rtt_s=0.2), "b": sig("b", rtt_s=0.001), "de": sig("de")}
    first = rank(TRIO, signals, ctx()).ranked[0]
    assert first.cluster == "b" and first.network_s == 0.001


def test_saturated_nearest_spills_over_instead_of_queueing():
    signals = {c: sig(c) for c in ("b", "de")}
    signals["a"] = sig("a", loads={"chat": load(in_flight=8, capacity=8)})
    choice = rank(TRIO, signals, ctx())
    assert order(choice) == ["b", "de", "a"]
    assert "spill-over: a is saturated" in choice.ranked[0].why


def test_own_in_flight_counts_before_the_next_report():
    signals = {c: sig(c) for c in ("b", "de")}
    signals["a"] = sig("a", own_in_flight={"chat": 8})
    assert order(rank(TRIO, signals, ctx()))[0] == "b"


def test_own_requests_that_finished_since_the_report_no_longer_count():
    """A report up to a second old counted this gateway's own requests then; those that have
    finished since must not keep the near plane "saturated" (bench/failover.py (d) sent
    traffic across an ocean to an idle plane's neighbour because of it)."""
    signals = {c: sig(c) for c in ("b", "de")}
    signals["a"] = sig("a", loads={"chat": load(in_flight=8)}, own_at_load={"chat": 8})
    assert order(rank(TRIO, signals, ctx()))[0] == "a"
    others = sig("a", loads={"chat": load(in_flight=8)}, own_at_load={"chat": 2},
                 own_in_flight={"chat": 2})  # fmt: skip
    signals["a"] = others  # 6 of other gateways' requests + our 2 still running: full
    assert order(rank(TRIO, signals, ctx()))[0] == "b"


def test_queue_wait_and_cold_penalty_add_to_the_network():
    signals = {
        "a": sig("a", loads={"chat": load(ready=0, capacity=0)}),
        "b": sig("b", loads={"chat": load(queue=0)}),
    }
    choice = rank(route(plane("a", US_EAST), plane("b", US_WEST)), signals, ctx())
    assert order(choice) == ["b", "a"]
    cold = choice.ranked[1]
    assert cold.cold_s == ChoiceParams().cold_penalty_s


def test_residency_never_routes_across_the_border_even_when_its_planes_are_down():
    signals = {c: sig(c) for c in ("a", "b")}
    signals["de"] = sig("de", ejected=True, ejected_reason="connection refused")
    choice = rank(TRIO, signals, ctx(jurisdictions=frozenset({"DE"})))
    assert order(choice) == ["de"] and choice.last_resort  # tried anyway, never a or b
    assert choice.refusal is not None and "in DE" in choice.refusal
    healthy = rank(
        TRIO, {c: sig(c) for c in ("a", "b", "de")}, ctx(jurisdictions=frozenset({"DE"}))
    )
    assert order(healthy) == ["de"]


def test_deployment_residency_intersects_with_the_request():
    own = route(plane("a", US_EAST), plane("de", EU), jurisdictions=["DE", "FR"])
    assert allowed_jurisdictions(own, frozenset({"DE"})) == frozenset({"DE"})
    assert allowed_jurisdictions(own, frozenset({"US"})) is None
    refused = rank(own, {}, ctx(jurisdictions=frozenset({"US"})))
    assert refused.ranked == () and "DE, FR" in (refused.refusal or "")
    assert order(rank(own, {c: sig(c) for c in ("a", "de")}, ctx())) == ["de"]


def test_stale_load_reports_take_a_plane_out_only_while_reports_flow():
    signals = {"a": sig("a", load_at=96.0), "b": sig("b")}
    two = route(plane("a", US_EAST), plane("b", US_WEST))
    flowing = rank(two, signals, ctx())
    assert order(flowing) == ["b"]
    assert "no load report for 4.0s" in dict(flowing.excluded)["a"]
    quiet = rank(two, signals, ctx(reports_flowing=False))  # NATS down: static stability
    assert order(quiet) == ["a", "b"]


def test_active_passive_uses_the_standby_only_when_no_active_can_serve():
    ap = route(plane("a", US_EAST), plane("b", US_WEST, role="standby"),
               failover="active_passive", hold_down_seconds=30)  # fmt: skip
    healthy = {c: sig(c) for c in ("a", "b")}
    assert order(rank(ap, healthy, ctx())) == ["a"]
    down = {"a": sig("a", ejected=True, ejected_reason="x"), "b": sig("b")}
    failed_over = rank(ap, down, ctx())
    assert order(failed_over) == ["b"] and "standby" in failed_over.ranked[0].why
    back = {"a": sig("a", healthy_since=90.0), "b": sig("b")}
    assert order(rank(ap, back, ctx())) == ["b"]  # hold-down: 10 s of 30
    settled = {"a": sig("a", healthy_since=60.0), "b": sig("b")}
    assert order(rank(ap, settled, ctx())) == ["a"]
    standby_down = {"a": sig("a", healthy_since=99.0), "b": sig("b", ejected=True)}
    assert order(rank(ap, standby_down, ctx())) == ["a"]


def test_a_recovered_plane_ramps_its_capacity_up():
    two = route(plane("a", US_EAST), plane("b", US_WEST))
    just_back = {"a": sig("a", healthy_since=99.5, loads={"chat": load(in_flight=1)}),
                 "b": sig("b")}  # fmt: skip
    assert order(rank(two, just_back, ctx())) == ["b", "a"]  # 10 % of 8 slots: full at 1
    later = {"a": sig("a", healthy_since=80.0, loads={"chat": load(in_flight=1)}), "b": sig("b")}
    assert order(rank(two, later, ctx())) == ["a", "b"]


def test_when_every_plane_is_out_they_are_tried_anyway_stale_before_ejected():
    three = route(plane("a", US_EAST), plane("b", US_WEST), plane("c", US_EAST))
    signals = {
        "a": sig("a", ejected=True, ejected_reason="stream broke: connection lost"),
        "b": sig("b", ejected=True, ejected_reason="health probe: no response within 0.5s"),
        "c": sig("c", load_at=90.0),
    }
    choice = rank(three, signals, ctx())
    assert choice.last_resort and order(choice)[0] == "c"
    assert set(order(choice)) == {"a", "b", "c"}
    assert "last resort" in choice.ranked[0].why
    assert "health probe" in (choice.refusal or "")  # what the caller hears if all fail
    signals["c"] = sig("c")
    healthy_one = rank(three, signals, ctx())
    assert order(healthy_one) == ["c"] and not healthy_one.last_resort


def test_a_vanishing_service_rate_is_a_long_wait_not_an_infinite_one():
    """A report's rate may be any positive float: 1e-300 made the wait inf, and
    /debug/routes then wrote `Infinity`, which no JSON parser reads."""
    import json

    signals = {"a": sig("a", loads={"chat": load(queue=10**9, rate=1e-300)})}
    (ranked,) = rank(route(plane("a", US_EAST)), signals, ctx()).ranked
    assert 0 < ranked.queue_s < float("inf")
    json.dumps(ranked.queue_s, allow_nan=False)
