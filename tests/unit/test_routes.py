"""The gateways' routing table, built from plain data (`controlplane.routes`)."""

from __future__ import annotations

from controlplane.routes import Plane, Served, Site, build_routes, residency
from controlplane.specs import FailoverSpec, PlacementSpec

SITES = (
    Site("us-east", "US", 38.9, -77.4, "aws"),
    Site("eu-central", "DE", 50.1, 8.7, "aws"),
    Site("tokyo", "JP", 35.7, 139.7, "local"),
)
PLANES = (
    Plane("use1", "us-east", "http://10.0.0.1:8200/"),
    Plane("euc1", "eu-central", "http://10.0.0.2:8200"),
    Plane("tyo1", "tokyo", "http://10.0.0.3:8200"),
    Plane("dark", "us-east", None),
)


def served(name: str = "chat", **replicas: int) -> Served:
    return Served(name=name, replicas=replicas)


def test_every_cluster_carrying_replicas_is_listed_with_its_place_and_count():
    book = build_routes([served(use1=2, euc1=1, tyo1=0)], PLANES, SITES)
    (route,) = book.deployments
    assert route.name == "chat" and route.failover == "active_active"
    assert [(p.cluster, p.replicas, p.role) for p in route.planes] == [
        ("euc1", 1, "active"),
        ("use1", 2, "active"),
    ]
    use1 = route.planes[1]
    assert use1.endpoint == "http://10.0.0.1:8200"  # no trailing slash: paths are appended
    assert (use1.region, use1.jurisdiction, use1.provider) == ("us-east", "US", "aws")
    assert (use1.latitude, use1.longitude) == (38.9, -77.4)


def test_every_region_is_in_the_table_even_without_planes():
    book = build_routes([], PLANES, SITES)
    assert [r.name for r in book.regions] == ["eu-central", "tokyo", "us-east"]
    assert book.regions[1].jurisdiction == "JP"
    assert book.deployments == ()


def test_a_deployment_placed_nowhere_is_listed_without_planes():
    (route,) = build_routes([served()], PLANES, SITES).deployments
    assert route.planes == []  # the gateway answers "no plane" rather than "unknown model"


def test_a_cluster_without_endpoint_is_left_out_and_named():
    book = build_routes([served(dark=3, use1=1)], PLANES, SITES)
    assert [p.cluster for p in book.deployments[0].planes] == ["use1"]
    assert book.unreachable == (("chat", "dark"),)


def test_residency_comes_from_jurisdictions_and_allowed_regions():
    sites = {s.name: s for s in SITES}
    assert residency(PlacementSpec(), sites) == []
    assert residency(PlacementSpec(allowed_jurisdictions=["DE", "US"]), sites) == ["DE", "US"]
    assert residency(PlacementSpec(allowed_regions=["tokyo", "eu-central"]), sites) == ["DE", "JP"]
    both = PlacementSpec(allowed_jurisdictions=["DE", "US"], allowed_regions=["eu-central"])
    assert residency(both, sites) == ["DE"]
    # disjoint: nothing can be placed, and the explicit jurisdictions stand (never "anywhere")
    disjoint = PlacementSpec(allowed_jurisdictions=["US"], allowed_regions=["tokyo"])
    assert residency(disjoint, sites) == ["US"]


def test_a_plane_outside_the_residency_is_never_listed():
    dep = Served(
        name="eu-only",
        placement=PlacementSpec(allowed_jurisdictions=["DE"]),
        replicas={"euc1": 1, "use1": 1},
    )
    book = build_routes([dep], PLANES, SITES)
    (route,) = book.deployments
    assert route.jurisdictions == ["DE"]
    assert [p.cluster for p in route.planes] == ["euc1"]
    assert book.outside == (("eu-only", "use1"),)


def test_active_passive_marks_the_standby_plane_and_carries_the_hold_down():
    failover = FailoverSpec.model_validate(
        {"mode": "active_passive", "standby_cluster": "tyo1", "hold_down_seconds": 45}
    )
    dep = Served(name="chat", failover=failover, replicas={"use1": 2, "tyo1": 1})
    (route,) = build_routes([dep], PLANES, SITES).deployments
    assert route.failover == "active_passive" and route.hold_down_seconds == 45
    assert {p.cluster: p.role for p in route.planes} == {"tyo1": "standby", "use1": "active"}


def test_the_digest_moves_with_the_content_only():
    one = build_routes([served(use1=2)], PLANES, SITES)
    again = build_routes([served(use1=2)], list(reversed(PLANES)), list(reversed(SITES)))
    assert one.digest() == again.digest()
    assert build_routes([served(use1=3)], PLANES, SITES).digest() != one.digest()
    moved = (Plane("use1", "us-east", "http://10.0.0.9:8200"), *PLANES[1:])
    assert build_routes([served(use1=2)], moved, SITES).digest() != one.digest()


def test_a_plane_still_serving_from_draining_instances_stays_listed():
    dep = Served(name="chat", replicas={"use1": 2}, leaving={"euc1": 1, "use1": 1})
    (route,) = build_routes([dep], PLANES, SITES).deployments
    assert [(p.cluster, p.replicas) for p in route.planes] == [("euc1", 1), ("use1", 3)]
