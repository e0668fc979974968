"""Active-passive standby replicas: an input transformation of the real engine, folded back."""

from __future__ import annotations

from dataclasses import replace

from controlplane import placement as engine
from controlplane.services.standby import Standby, fold_standbys, with_standbys
from tests.unit.placement.builders import make_deployment, make_input, make_pool

STANDBY = Standby(
    deployment="chat",
    cluster="c-eu",
    region="aws:eu-central-1",
    pools=frozenset({"eu"}),
    replicas=2,
)


def world(**deployment: object) -> engine.PlacementInput:
    pools = [
        make_pool("us", region="aws:us-east-1", price=2.0, capacity=16),
        make_pool("eu", region="aws:eu-central-1", price=5.0, capacity=16),
    ]
    return make_input(pools, [make_deployment("chat", replicas=3, **deployment)])  # type: ignore[arg-type]


def place(inp: engine.PlacementInput, standbys: dict[str, Standby]) -> engine.PlacementResult:
    return fold_standbys(engine.place(with_standbys(inp, standbys)), standbys)


def by_cluster(result: engine.PlacementResult, deployment: str = "chat") -> dict[str, int]:
    out: dict[str, int] = {}
    for a in result.assignments:
        if a.deployment == deployment:
            out[a.cluster] = out.get(a.cluster, 0) + a.replicas
    return out


def test_the_standby_cluster_carries_exactly_the_standby_replicas():
    result = place(world(), {"chat": STANDBY})
    assert by_cluster(result) == {"c-us": 3, "c-eu": 2}
    assert not result.unplaced
    assert {a.deployment for a in result.assignments} == {"chat"}  # no synthetic name leaks


def test_the_standby_is_priced_with_its_deployment():
    without = engine.place(world())
    with_standby = place(world(), {"chat": STANDBY})
    assert without.cost_per_hour["chat"] == 3 * 2.0
    assert with_standby.cost_per_hour["chat"] == 3 * 2.0 + 2 * 5.0
    assert "chat/standby" not in with_standby.cost_per_hour


def test_without_a_standby_the_engine_sees_its_input_unchanged():
    inp = world()
    assert with_standbys(inp, {}) is inp
    result = engine.place(inp)
    assert fold_standbys(result, {}) is result


def test_the_actives_avoid_the_standby_region_even_when_it_is_cheaper():
    inp = world()
    inp = replace(
        inp,
        pools=tuple(replace(p, price_per_gpu_hour=1.0) if p.id == "eu" else p for p in inp.pools),
    )
    assert by_cluster(engine.place(inp)) == {"c-eu": 3}  # the engine alone would go there
    assert by_cluster(place(inp, {"chat": STANDBY})) == {"c-us": 3, "c-eu": 2}


def test_a_deployment_allowed_only_in_the_standby_region_shares_it():
    result = place(world(allowed_regions=frozenset({"aws:eu-central-1"})), {"chat": STANDBY})
    assert by_cluster(result) == {"c-eu": 5}


def test_a_standby_that_does_not_fit_is_explained_not_hidden():
    small = replace(STANDBY, replicas=20)  # 20 GPUs wanted, 16 in the standby's pool
    result = place(world(), {"chat": small})
    assert by_cluster(result)["c-eu"] == 16
    (unplaced,) = result.unplaced
    assert unplaced.deployment == "chat" and unplaced.replicas == 4
    assert unplaced.reason.startswith("standby on cluster c-eu: ")
    assert "chat/standby" not in unplaced.reason


def test_a_kept_standby_does_not_move_on_the_next_plan():
    standbys = {"chat": STANDBY}
    first = place(world(), standbys)
    second = place(replace(world(), current=first.assignments), standbys)
    assert second.assignments == first.assignments
    assert second.changes == ()


def test_a_standby_in_a_pool_its_cluster_lacks_is_reported_unplaced():
    inp = world()
    # another cluster of the standby's region with a pool of its own
    inp = replace(
        inp,
        pools=(*inp.pools, make_pool("eu2", region="aws:eu-central-1", price=0.5, capacity=16)),
        clusters=(*inp.clusters, engine.Cluster("c-eu2", ("eu2",))),
    )
    result = place(inp, {"chat": STANDBY})
    assert "c-eu2" not in by_cluster(result)
    stray = [u for u in result.unplaced if u.constraint == "standby_cluster"]
    assert stray and stray[0].replicas == 2 and "c-eu" in stray[0].reason
