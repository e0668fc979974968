"""The min-cost-flow quotas (network.py) and the engine path that uses them above
MAX_CLASSES: whole, feasible quotas; the hard rules; no more unplaced than the optimum."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.placement import engine, network, place, transport
from controlplane.placement.lp import lower_bound, unplaced_optimum
from tests.unit.placement.builders import make_deployment, make_input, make_pool
from tests.unit.placement.rules import check_rules
from tests.unit.placement.test_many_classes import SETTINGS, world

INF = math.inf


def problem(cost, sizes, demand, free, spot_cap=None, is_spot=None, spread=()):
    cost = np.array(cost, dtype=float)
    n_c, n_p = cost.shape
    return transport.Problem(
        cost=cost,
        sizes=np.array(sizes, dtype=np.int64),
        demand=np.array(demand, dtype=np.int64),
        spot_cap=np.array(spot_cap if spot_cap is not None else [0] * n_c, dtype=np.int64),
        priority_rank=np.zeros(n_c, dtype=np.int64),
        free=np.array(free, dtype=np.int64),
        is_spot=np.array(is_spot if is_spot is not None else [False] * n_p, dtype=bool),
        spread=spread,
    )


def check_quotas(pr: transport.Problem, q: np.ndarray) -> None:
    assert q.dtype == np.int64 and (q >= 0).all()
    assert (q[~np.isfinite(pr.cost)] == 0).all()  # only admissible pools
    assert ((q * pr.sizes[:, None]).sum(axis=0) <= pr.free).all()  # no pool over-committed
    assert (q.sum(axis=1) <= pr.demand).all()
    assert (q[:, pr.is_spot].sum(axis=1) <= pr.spot_cap).all()


def test_whole_replicas_where_the_gpu_flow_would_split_them():
    # 8-GPU replicas x 2 and a 4-GPU one on pools of 12 (cheap) and 8 GPUs: the only way to
    # place all is 8 + 4 in the 12-GPU pool and 8 in the other
    unit = np.array([1.0, 3.0])
    pr = problem([[1.0, 3.0], [1.0, 3.0]], sizes=[8, 4], demand=[2, 1], free=[12, 8])
    q = network.solve(pr, unit, np.array([0, 0]))
    assert q is not None
    check_quotas(pr, q)
    assert q.tolist() == [[1, 1], [1, 0]]


def test_divisibility_cuts_keep_the_gpu_flow_whole():
    # one pool of 14 GPUs for an 8-GPU replica, three 4-GPU ones and two 1-GPU ones: a
    # GPU flow bounded only per size would give the 4-GPU class 6 GPUs (1.5 replicas) and
    # the 1-GPU class none; with the pool's cut (8- and 4-GPU replicas use at most 12 of
    # its 14 GPUs) the flow itself is whole: 8 + 4 + 1 + 1, the pool full
    unit = np.array([1.0])
    pr = problem([[1.0], [1.0], [1.0]], sizes=[8, 4, 1], demand=[1, 3, 2], free=[14])
    q = network.solve(pr, unit, np.array([0]))
    assert q is not None
    check_quotas(pr, q)
    assert q.tolist() == [[1], [1], [2]]


def test_equally_cheap_pools_are_shared_out_so_that_whole_replicas_fit():
    # two pools at one price (20 and 24 GPUs) for five 2-GPU, four 4-GPU and two 8-GPU
    # replicas (42 GPUs): every equally cheap GPU flow costs the same, but cut into whole
    # replicas per pool some lose one. Without the pool tie-break (network._pool_tie) the
    # solver's flow left an 8-GPU replica out (34 of 42 GPUs); with it all 42 fit.
    unit = np.array([1.0, 1.0])
    pr = problem([[1.0, 1.0]] * 3, sizes=[2, 4, 8], demand=[5, 4, 2], free=[20, 24])
    q = network.solve(pr, unit, np.array([0, 0]))
    assert q is not None
    check_quotas(pr, q)
    assert q.sum(axis=1).tolist() == [5, 4, 2]


def test_the_pool_tie_break_stays_below_a_price_step_and_gives_each_size_its_own_pools():
    pools = np.arange(1000)
    ties = [network._pool_tie(pools, np.full(1000, k), 4, 1000) for k in range(4)]
    assert all(t.min() >= 0 and t.max() < network.POOL_TIE for t in ties)
    favourite = [int(np.argmin(t)) for t in ties]
    assert favourite == [0, 250, 500, 750]  # each size starts on its own quarter


def test_spot_budget_and_admissibility():
    unit = np.array([0.5, 2.0, 1.0])
    pr = problem(
        [[0.5, 2.0, INF], [INF, 2.0, 1.0]],
        sizes=[2, 1],
        demand=[4, 3],
        free=[8, 8, 2],
        spot_cap=[1, 0],
        is_spot=[True, False, False],
    )
    q = network.solve(pr, unit, np.array([0, 1, 2]))
    assert q is not None
    check_quotas(pr, q)
    assert q.tolist() == [[1, 3, 0], [0, 1, 2]]  # one spot replica, the rest on demand


def test_spread_cap_per_provider():
    # one class may hold at most 3 replicas on provider 0 (its spread cap)
    spread = (transport.Spread(np.array([0, 0, 1]), np.array([[3.0, INF]])),)
    pr = problem([[1.0, 1.0, 2.0]], sizes=[1], demand=[5], free=[4, 4, 4], spread=spread)
    q = network.solve(pr, np.array([1.0, 1.0, 2.0]), np.array([0, 0, 1]))
    assert q is not None
    check_quotas(pr, q)
    assert q[0, :2].sum() == 3 and q[0, 2] == 2


def test_pools_seen_alike_share_a_group():
    pr = problem(
        [[1.0, 2.0, 1.0, INF], [1.5, 2.5, 1.5, 1.5]], sizes=[1, 1], demand=[1, 1], free=[1] * 4
    )
    group = network.pool_groups(pr, np.array([0, 0, 1, 0]))
    assert group[0] == group[1]  # same admissibility and region, only their own cost differs
    assert len({group[0], group[2], group[3]}) == 3  # another region; another admissibility


@pytest.fixture
def flow_path(monkeypatch):
    """place() takes the min-cost-flow path whatever the number of classes."""
    monkeypatch.setattr(engine, "MAX_CLASSES", 0)


def test_the_flow_path_places_the_optimum_on_a_hand_built_world(flow_path):
    pools = [
        make_pool("big", capacity=12, price=1.0),
        make_pool("small", region="gcp:us-central1", provider="gcp", capacity=8, price=3.0),
        make_pool("l4", gpu_type="L4", capacity=6, price=0.5, gpus_per_instance=4),
    ]
    deps = [
        make_deployment("x", gpus=8, replicas=2, traffic={"aws:us-east-1": 1.0}),
        make_deployment("y", gpus=4, replicas=1, traffic={"gcp:us-central1": 1.0}),
        make_deployment("z", gpus=2, replicas=3, gpu_types=("L4", "H100")),
        make_deployment("w", gpus=1, replicas=2, min_distinct_providers=2),
    ]
    inp = make_input(pools, deps)
    result = place(inp)
    check_rules(inp, result)
    unplaced = sum(u.replicas * u.gpus_per_replica for u in result.unplaced)
    assert unplaced == round(unplaced_optimum(inp).unplaced_gpus)  # 16 + 4 + 6 + 2 of 32
    placed = sum(d.target_replicas * d.gpus_per_replica for d in deps) - unplaced
    bound = lower_bound(inp, placed_gpus=placed - 1e-6).cost
    assert result.objective_per_hour <= bound * 1.005 + 1e-9


@SETTINGS
@given(st.integers(0, 10**6), st.sampled_from([0.7, 0.95]))
def test_rules_hold_on_the_flow_path(seed, load):
    inp = world(seed, 120, load)
    with pytest.MonkeyPatch.context() as mp:  # the flow path whatever the classes
        mp.setattr(engine, "MAX_CLASSES", 0)
        result = place(inp)
        again = place(dataclasses.replace(inp, current=result.assignments))
    check_rules(inp, result)
    unplaced = sum(u.replicas * u.gpus_per_replica for u in result.unplaced)
    assert unplaced >= math.floor(lower_bound(inp).unplaced_bound)
    assert again.changes == ()  # stable: a re-plan of its own result moves nothing


def test_the_flow_path_prints_nothing(flow_path, capfd):
    place(world(3, 60, 0.95))
    assert capfd.readouterr() == ("", "")


def test_region_caps_hold_beside_provider_caps():
    # provider 0 holds regions 0 and 1 (cheapest first); the class may put 4 replicas on
    # provider 0 and 2 (then 5: no tighter than the provider's, its node left out) in one
    # region of it
    region, provider = np.array([0, 1, 2]), np.array([0, 0, 1])
    unit = np.array([1.0, 1.5, 2.0])
    for region_cap, expect in ((2.0, [2, 2, 2]), (5.0, [4, 0, 2])):
        spread = (
            transport.Spread(provider, np.array([[4.0, 4.0]])),
            transport.Spread(region, np.array([[region_cap] * 3])),
        )
        pr = problem([unit.tolist()], sizes=[1], demand=[6], free=[8, 8, 8], spread=spread)
        q = network.solve(pr, unit, region)
        assert q is not None
        check_quotas(pr, q)
        assert q[0].tolist() == expect


def _direct_flow(n_nodes, tail, head, cap, cost, supply) -> int:
    """The optimum cost of the network as given (no contraction)."""
    order = np.lexsort((head, tail))
    graph = network.CGraph(n_nodes, tail[order].astype(np.int32), head[order].astype(np.int32))
    graph.set_node_supply(supply)
    graph.set_edge_capacities(cap[order])
    graph.set_edge_costs(cost[order])
    graph.solve()
    return int((np.asarray(graph.result()) * cost[order]).sum())


@pytest.mark.parametrize("seed", range(40))
def test_contracted_network_carries_the_same_optimal_flow(seed):
    # random networks full of pass-through chains (one arc in, one out): the flow that
    # _min_cost_flow returns per original arc is feasible and as cheap as the optimum of
    # the network solved as given
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 14))
    sources, sink = [0, 1], n - 1
    tail, head = [], []
    for _ in range(int(rng.integers(n, 3 * n))):
        u, v = (int(x) for x in rng.choice(n, size=2, replace=False))
        if u != sink and v not in sources:
            tail.append(u)
            head.append(v)
    for s in sources:  # the unplaced arcs: always feasible
        tail.append(s)
        head.append(sink)
    # pass-through chains hanging between random nodes
    for _ in range(int(rng.integers(1, 4))):
        u, v = int(rng.integers(0, n - 1)), int(rng.integers(2, n))
        chain = [u, *range(n, n + int(rng.integers(1, 4))), v]
        n += len(chain) - 2
        tail += chain[:-1]
        head += chain[1:]
    t, h = np.array(tail, dtype=np.int64), np.array(head, dtype=np.int64)
    keep = t != h
    t, h = t[keep], h[keep]
    cap = rng.integers(0, 9, size=len(t)).astype(np.int64)
    cost = rng.integers(0, 20, size=len(t)).astype(np.int64)
    cap[-1:] = 100
    supply = np.zeros(n, dtype=np.int64)
    supply[sources] = rng.integers(1, 10, size=2)
    cap[(t == 0) & (h == sink)] = cap[(t == 1) & (h == sink)] = 100
    cost[(h == sink) & np.isin(t, sources)] = 1000
    supply[sink] = -supply[sources].sum()
    flow = network._min_cost_flow(n, t, h, cap, cost, supply)
    assert flow is not None
    assert ((flow >= 0) & (flow <= cap)).all()
    balance = np.bincount(t, weights=flow, minlength=n) - np.bincount(h, weights=flow, minlength=n)
    assert balance.astype(np.int64).tolist() == supply.tolist()
    assert int((flow * cost).sum()) == _direct_flow(n, t, h, cap, cost, supply)
