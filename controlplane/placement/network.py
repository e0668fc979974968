"""Quotas for many classes: a min-cost flow in GPUs (LEMON's network simplex, pylmcf).

Above MAX_CLASSES classes the class x pool LP through HiGHS's general simplex takes
seconds. Without the whole-replica coupling of a pool's replica sizes the problem is a
network, solved exactly in integers (costs in 1e-4 $/GPU-hour, each step split in
POOL_TIE for a tie-break among equally cheap pools) by LEMON's network simplex. Flow in
GPUs:

  class c (supply size_c * demand_c)
    -> [its spot node: size_c * spot budget]      (on the way to spot pools only)
    -> [its (provider) and (region) nodes: size_c * spread cap]   (if it asks for 2+)
    -> hub (size_c, pool group g)    unit cost: c's location cost in g
    -> (pool p, size) of g           unit cost: p's own cost, cap size * floor(free_p/size)
    -> (pool p, next smaller size dividing it) ... -> pool p    cap size * floor(free_p/size)
    -> sink                          cap free_p
  class c -> sink                    unplaced, unit cost: the class's priority penalty

A pool group holds the pools that every class sees alike: the same admissibility, spot,
provider and region, so that cost[c, p] = unit[p] + location[c, g] (the caller's `unit`,
the marginal price; the engine's cost rows are built that way and this is checked: a pool
that breaks it is a group of its own). The hubs make this exact with C x G + sizes x P
arcs instead of C x P (1,730 classes x 2,000 pools: ~200k arcs instead of ~575k).

The chain of (pool, size) nodes is the class LP's divisibility cuts as a network: the
replicas whose size is a multiple of s (1 | 2 | 4 | 8) use at most s * floor(free_p / s)
GPUs of pool p. Without it the GPU flow filled a pool's odd remainder with fractions of
big replicas (300 shapes at 92 %: relaxation 1,939 GPUs unplaced against an optimum of
2,227, 1,292 GPUs lost in rounding); with it the flow's unplaced GPUs equal the whole-
replica optimum on the bench's families and few flows split a replica.

Whole replicas: within a hub every class pays the same for every pool, so the hub's GPU
flow is cut into whole replicas per pool (floor; one more where the pool still has the
room), and these replica slots go to the hub's classes by their flow (floor, then the
largest remainders while a class has demand and spot budget left), cheapest pools first.
Only a pool's mix of sizes loses GPUs to rounding, at most size - 1 per (pool, size);
the fill, the second pass and repair place that. So that fewer pools mix sizes, each
replica size prefers its own stretch of the pool numbering among equally cheap pools
(`_pool_tie`, session 16).
The spread nodes assume a region lies within one provider (as region names do here).

Smaller network, same optimum: a spread node whose cap cannot bind is left out (a cap of
at least the class's demand, or a region's cap not below that of the class's node for
the region's provider), and the solver sees the network without its pass-through nodes
(one arc in, one out, no supply: a region with one group, the top of a pool's size
chain, the pool node under its one size), whose two arcs become one (`contract`). One
shape per deployment, 92 %, seed 7: 35.6k nodes -> 17.7k (arcs 209k -> 191k), the solve
0.74-0.86 -> 0.40-0.54 CPU s on a shared machine; 1,000 shapes 24.5k -> 12.7k, 0.43 -> 0.21 s.
Then the nodes after the classes are renumbered (`_scatter`): ~30 % fewer pivots.
Deterministic: the solver is exact and single-threaded; ties are broken by index.
Returns None when pylmcf is missing or the solver fails; the caller falls back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.ma  # np.unique imports it on first use (~0.1 s, in a re-plan)

from controlplane.placement import transport

# imported with the module, not in the first place() call (~0.1 CPU s of a re-plan)
CGraph: Any
try:
    from pylmcf.pylmcf_cpp import CGraph
except ImportError:  # pragma: no cover - pylmcf is a dependency
    CGraph = None

COST_SCALE = 10_000  # integer unit costs: 1e-4 $/GPU-hour ...
POOL_TIE = 256  # ... in steps of POOL_TIE, the pool tie-break below them (`_pool_tie`)
SIZE_TIE = 0.001  # unplaced penalty x (1 + SIZE_TIE x size): a tie-break among equal GPUs


def _int_costs(cost: np.ndarray) -> np.ndarray:
    return np.round(cost * COST_SCALE).astype(np.int64) * POOL_TIE


def _pool_tie(pool: np.ndarray, size_rank: np.ndarray, n_sizes: int, n_pools: int) -> np.ndarray:
    """A cost below 1e-4 $/GPU-hour on each (hub -> pool) arc that ranks a hub's pools of
    equal price: each replica size prefers its own stretch of the pool numbering (size
    k of n starts at pool k x n_pools / n, and goes round). Among the equally cheap flows
    the solver then returns one whose sizes share fewer pools, and only a pool's mix of
    sizes loses GPUs when the flow is cut into whole replicas. Without it, 48 fleets
    (seeds 1-5, 7, 11, 13; 300, 1,000 and one shape per deployment; 70 and 92 %) left 52
    GPUs more unplaced, 9 cases above the LP bound that this puts on it and 1 the other
    way round (docs/placement.md, session 16); the solver takes ~30-60 % longer with it.
    Each GPU's path crosses one such arc, so the tie moves the optimum's cost by less
    than 1e-4 $/GPU-hour per GPU."""
    start = (size_rank * n_pools) // n_sizes
    return ((pool + n_pools - start) % n_pools * (POOL_TIE - 1)) // n_pools


def pool_groups(
    pr: transport.Problem, region: np.ndarray, finite: np.ndarray | None = None
) -> np.ndarray:
    """Group of each pool: pools every class sees alike (admissibility, spot, spread groups
    and region), numbered by their first pool. `finite`: np.isfinite(pr.cost) if known."""
    finite = np.isfinite(pr.cost) if finite is None else finite
    # each pool's admissibility column, packed into bytes: equal columns, equal bytes
    bits = np.ascontiguousarray(np.packbits(finite, axis=0).T)
    if bits.shape[1]:
        _, seen_by = np.unique(bits.view(np.dtype((np.void, bits.shape[1]))), return_inverse=True)
    else:  # no classes: every pool is seen alike
        seen_by = np.zeros(len(bits), dtype=np.int64)
    key = np.stack(
        [seen_by.ravel(), pr.is_spot.astype(np.int64), region.astype(np.int64)]
        + [sp.group.astype(np.int64) for sp in pr.spread]
    )
    _, first, group = np.unique(key, axis=1, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # number groups by their first pool
    return rank[group.ravel()]


def contract(n_nodes, tail, head, cap, cost, supply):
    """The same network without its pass-through nodes (no supply, one arc in, one out).

    u -> v -> w becomes u -> w at the smaller capacity and the summed cost, which carries
    the same flows at the same cost, and the network simplex has fewer nodes to pivot
    (one shape per deployment: 11k of 29k nodes; ~40 % less solver time). Returns
    (n_nodes, tail, head, cap, cost, supply, arc) where arc[i] is the new arc that carries
    the flow of old arc i."""
    tail, head, cap, cost = tail.copy(), head.copy(), cap.copy(), cost.copy()
    alive = np.ones(len(tail), dtype=bool)
    arc = np.arange(len(tail))
    while True:
        ids = np.flatnonzero(alive)
        through = (
            (np.bincount(head[ids], minlength=n_nodes) == 1)
            & (np.bincount(tail[ids], minlength=n_nodes) == 1)
            & (supply == 0)
        )
        arc_in = np.full(n_nodes, -1, dtype=np.int64)
        arc_out = np.full(n_nodes, -1, dtype=np.int64)
        arc_in[head[ids]] = ids
        arc_out[tail[ids]] = ids
        v = np.flatnonzero(through)
        v = v[~through[tail[arc_in[v]]]]  # the first of each chain: one link a round
        if not len(v):
            break
        a, b = arc_in[v], arc_out[v]
        head[a] = head[b]
        cap[a] = np.minimum(cap[a], cap[b])
        cost[a] += cost[b]
        alive[b] = False
        into = np.full(len(tail), -1, dtype=np.int64)
        into[b] = a
        moved = into[arc] >= 0
        arc[moved] = into[arc[moved]]
    ids = np.flatnonzero(alive)
    used = supply != 0
    used[tail[ids]] = True
    used[head[ids]] = True
    number = np.cumsum(used) - 1
    position = np.full(len(tail), -1, dtype=np.int64)
    position[ids] = np.arange(len(ids))
    return (
        int(used.sum()),
        number[tail[ids]],
        number[head[ids]],
        cap[ids],
        cost[ids],
        supply[used],
        position[arc],
    )


def _min_cost_flow(n_nodes, tail, head, cap, cost, supply) -> np.ndarray | None:
    """Optimal integral flow per arc (LEMON's network simplex), or None."""
    if CGraph is None:  # pragma: no cover - pylmcf is a dependency
        return None
    n_nodes, tail, head, cap, cost, supply, arc = contract(n_nodes, tail, head, cap, cost, supply)
    tail, head, supply = _scatter(n_nodes, tail, head, supply)
    order = np.lexsort((head, tail))  # the solver takes arcs sorted by (tail, head)
    graph = CGraph(n_nodes, tail[order].astype(np.int32), head[order].astype(np.int32))
    graph.set_node_supply(supply)
    graph.set_edge_capacities(cap[order])
    graph.set_edge_costs(cost[order])
    try:
        graph.solve()
    except RuntimeError:  # infeasible or unbounded: cannot happen with the unplaced arcs
        return None
    flow = np.empty(len(tail), dtype=np.int64)
    flow[order] = graph.result()
    return flow[arc]


NODE_STRIDE = 7  # the nodes after the classes: i -> i x 7 mod their number (coprime)


def _scatter(n_nodes: int, tail, head, supply):
    """The same network with the nodes after its leading supply nodes (the classes, kept
    first and in order) renumbered i -> i x NODE_STRIDE mod their number.

    The solver scans its arcs in blocks in (tail, head) order, so the numbering decides
    which arcs compete for each pivot. Built in layers (pools, spot, spread, hub and size
    nodes), a block holds the arcs of a few nodes of one kind; scattered, blocks mix them
    and LEMON pivots ~30 % less: 0.37-0.39 -> 0.25-0.26 CPU s at one shape per
    deployment, 0.20 -> 0.15 s at 1,000 shapes. The classes stay first and in order:
    scattering them too was as fast but its optimal flows, rounded to whole replicas,
    left 17-46 GPUs more unplaced over 32 fleets (seeds 7, 21, 23, 29, four families,
    70 and 92 %; any stride, docs/placement.md)."""
    first = int(np.argmin(supply > 0)) if (supply <= 0).any() else n_nodes
    rest = n_nodes - first
    k = NODE_STRIDE
    while rest > 1 and math.gcd(k, rest) != 1:
        k += 1
    new = np.concatenate([np.arange(first), first + np.arange(rest, dtype=np.int64) * k % rest])
    moved = np.empty_like(supply)
    moved[new] = supply
    return new[tail], new[head], moved


class _Arcs:
    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.n = 0

    def add(self, tail, head, cap, cost) -> int:
        """Append arcs (broadcast to tail's shape); returns the index of the first."""
        tail = np.asarray(tail, dtype=np.int64)
        parts = tuple(
            np.broadcast_to(np.asarray(a, dtype=np.int64), tail.shape).copy()
            for a in (head, cap, cost)
        )
        self.parts.append((tail, *parts))
        first = self.n
        self.n += len(tail)
        return first

    def arrays(self) -> list[np.ndarray]:
        return [np.concatenate([p[i] for p in self.parts]) for i in range(4)]


def solve(pr: transport.Problem, unit: np.ndarray, region: np.ndarray) -> np.ndarray | None:
    """Replica quotas C x P (whole, within free capacity and spot budgets).

    Precondition: cost[c, p] - unit[p] depends only on c and region[p] (the engine's cost
    rows are the marginal price plus a latency term per region)."""
    n_c, n_p = pr.cost.shape
    quotas = np.zeros((n_c, n_p), dtype=np.int64)
    sizes = pr.sizes.astype(np.int64)
    demand = np.maximum(pr.demand, 0).astype(np.int64)
    free = np.maximum(pr.free, 0).astype(np.int64)
    finite = np.isfinite(pr.cost)
    group = pool_groups(pr, region, finite)
    n_g = int(group.max()) + 1 if n_p else 0
    rep = np.zeros(n_g, dtype=np.int64)
    rep[group[::-1]] = np.arange(n_p)[::-1]  # first pool of each group
    size_values, size_of = np.unique(sizes, return_inverse=True)
    size_of = size_of.ravel()
    # replicas of each size each group can take; class x group pairs that may be used
    # (computed on the admissible pairs only, not as C x G arrays)
    slots = free[None, :] // size_values[:, None]  # S x P
    g_slots = np.stack([np.bincount(group, weights=s, minlength=n_g) for s in slots])
    cs, gs = np.nonzero(finite[:, rep])
    room = g_slots[size_of[cs], gs]  # replicas of the pair
    spot_g = pr.is_spot[rep]
    room = np.where(spot_g[gs], np.minimum(room, pr.spot_cap[cs]), room)
    room = np.minimum(room, demand[cs]).astype(np.int64)
    on = room > 0
    cs, gs, room = cs[on], gs[on], room[on]
    if not len(cs):
        return quotas

    sink = n_c + n_p
    n_nodes = sink + 1
    arcs = _Arcs()
    start = cs.copy()  # where each class -> hub arc starts
    spot = spot_g[gs]
    spot_classes = np.unique(cs[spot])
    if len(spot_classes):
        spot_node = np.full(n_c, -1, dtype=np.int64)
        spot_node[spot_classes] = n_nodes + np.arange(len(spot_classes))
        n_nodes += len(spot_classes)
        budget = np.minimum(pr.spot_cap[spot_classes], demand[spot_classes])
        arcs.add(spot_classes, spot_node[spot_classes], sizes[spot_classes] * budget, 0)
        start[spot] = spot_node[cs[spot]]
    # the most replicas of its class a pair's start node passes on: a spread node that
    # would not hold its pairs below that is left out (exact): a cap of at least the
    # class's demand, or a region's where the class's node for the region's provider
    # already holds it to as few replicas
    limit = demand[cs].astype(float)
    for sp in pr.spread:  # providers first, then regions (which lie within one)
        pair_cap = sp.cap[cs, sp.group[rep[gs]]]
        on = np.flatnonzero(~spot & np.isfinite(pair_cap) & (pair_cap < limit))
        limit[on] = pair_cap[on]
        if not len(on):
            continue
        width = int(sp.group.max()) + 1
        pair = cs[on] * width + sp.group[rep[gs[on]]]
        _, first, which = np.unique(pair, return_index=True, return_inverse=True)
        node = n_nodes + np.arange(len(first))
        n_nodes += len(first)
        kc, kg = cs[on[first]], sp.group[rep[gs[on[first]]]]
        cap = np.maximum(sp.cap[kc, kg], 0).astype(np.int64)
        arcs.add(start[on[first]], node, sizes[kc] * cap, 0)
        start[on] = node[which.ravel()]
    # hubs: one per (size, group) that some class uses
    hub_key = size_of[cs] * n_g + gs
    hubs, hub_of = np.unique(hub_key, return_inverse=True)
    hub_of = hub_of.ravel()
    hub_node = n_nodes + np.arange(len(hubs))
    n_nodes += len(hubs)
    location = _int_costs(pr.cost[cs, rep[gs]] - unit[rep[gs]])
    in_arc0 = arcs.add(start, hub_node[hub_of], sizes[cs] * room, location)
    # hub -> each of its group's pools with room for one replica of its size
    hub_s, hub_g = hubs // n_g, hubs % n_g
    by_group = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[by_group], np.arange(n_g + 1))
    width = bounds[hub_g + 1] - bounds[hub_g]  # each hub x its group's pools, in order
    out_h = np.repeat(np.arange(len(hubs)), width)
    out_p = by_group[np.repeat(bounds[hub_g], width) + _ranks(width)]
    with_room = slots[hub_s[out_h], out_p] > 0
    out_h, out_p = out_h[with_room], out_p[with_room]
    out_s = size_values[hub_s[out_h]]
    # divisibility cuts as a network: replicas whose size is a multiple of s use at most
    # s x floor(free / s) GPUs of a pool, so each size's node of a pool passes its flow on
    # to the node of the largest smaller size dividing it (the pool itself if none)
    size_node = np.full((len(size_values), n_p), -1, dtype=np.int64)
    for k, s_k in enumerate(size_values):
        ps = np.flatnonzero(slots[k] > 0)
        size_node[k, ps] = n_nodes + np.arange(len(ps))
        n_nodes += len(ps)
        parent = [j for j in range(k) if s_k % size_values[j] == 0]
        down = size_node[parent[-1], ps] if parent else n_c + ps
        arcs.add(size_node[k, ps], down, s_k * slots[k, ps], 0)
    out_arc0 = arcs.add(
        hub_node[out_h],
        size_node[hub_s[out_h], out_p],
        out_s * slots[hub_s[out_h], out_p],
        _int_costs(unit[out_p]) + _pool_tie(out_p, hub_s[out_h], len(size_values), n_p),
    )
    supply = sizes * demand
    # a GPU of a bigger replica left unplaced costs a little more: a fraction of a big
    # replica left over loses the whole replica in the rounding, a small one loses less
    penalty = transport._penalties(pr, finite) * (1.0 + SIZE_TIE * sizes)
    arcs.add(np.arange(n_c), sink, supply, _int_costs(penalty))
    arcs.add(n_c + np.arange(n_p), sink, free, 0)

    tail, head, cap, cost = arcs.arrays()
    supplies = np.zeros(n_nodes, dtype=np.int64)
    supplies[:n_c] = supply
    supplies[sink] = -int(supply.sum())
    f = _min_cost_flow(n_nodes, tail, head, cap, cost, supplies)
    if f is None:
        return None
    f_in = f[in_arc0 : in_arc0 + len(cs)]
    f_out = f[out_arc0 : out_arc0 + len(out_h)]
    _whole_replicas(pr, quotas, free, (cs, hub_of, f_in), (out_h, out_p, out_s, f_out), unit)
    return quotas


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[0] - 1, 0, 1, ..., counts[1] - 1, ...: each item's place in its run."""
    starts = np.cumsum(counts) - counts
    return np.arange(int(counts.sum())) - np.repeat(starts, counts)


def _whole_replicas(pr, quotas, free, into, out, unit) -> None:
    """Cut each hub's GPU flow into whole replicas per pool and hand them to its classes."""
    cs, hub_of, f_in = into
    out_h, out_p, out_s, f_out = out
    sizes = pr.sizes.astype(np.int64)
    # replica slots per (hub, pool): floor, then one more where the pool has the room
    r = f_out // out_s
    # sums per pool by bincount (exact: integers far below 2**53), not the slower ufunc.at
    left = free - np.bincount(out_p, weights=r * out_s, minlength=len(free)).astype(np.int64)
    frac = f_out - r * out_s
    for k in np.lexsort((np.arange(len(frac)), -frac)):
        if frac[k] == 0:
            break
        if left[out_p[k]] >= out_s[k]:
            r[k] += 1
            left[out_p[k]] -= out_s[k]
    # each class's replicas per hub: floor of its flow, then the largest remainders
    want = f_in // sizes[cs]
    rest = f_in - want * sizes[cs]
    n_hubs = int(hub_of.max()) + 1
    extra = np.bincount(out_h, weights=r, minlength=n_hubs).astype(np.int64)
    extra -= np.bincount(hub_of, weights=want, minlength=n_hubs).astype(np.int64)
    missing = np.maximum(pr.demand, 0) - np.bincount(cs, weights=want, minlength=len(sizes))
    spot_left = pr.spot_cap.astype(np.int64).copy()
    hub_spot = np.zeros(n_hubs, dtype=bool)
    hub_spot[out_h] = pr.is_spot[out_p]
    on_spot = hub_spot[hub_of]
    spot_left -= np.bincount(cs[on_spot], weights=want[on_spot], minlength=len(spot_left)).astype(
        np.int64
    )
    for k in np.lexsort((np.arange(len(rest)), -rest)):
        if rest[k] == 0:
            break
        h, c = hub_of[k], cs[k]
        if extra[h] > 0 and missing[c] > 0 and (not hub_spot[h] or spot_left[c] > 0):
            want[k] += 1
            extra[h] -= 1
            missing[c] -= 1
            spot_left[c] -= int(hub_spot[h])
    # lay the classes' replicas into the hub's pools, cheapest pools first
    with_room = np.flatnonzero(r > 0)
    pools_by_hub = with_room[
        np.lexsort((out_p[with_room], unit[out_p[with_room]], out_h[with_room]))
    ]
    wanting = np.flatnonzero(want > 0)
    classes_by_hub = wanting[
        np.lexsort((cs[wanting], -pr.priority_rank[cs[wanting]], hub_of[wanting]))
    ]
    # per hub, classes in order take the pools' replicas in order (north-west corner), as
    # far as the hub's replicas go
    room = r[pools_by_hub]
    room_of = np.bincount(out_h[pools_by_hub], weights=room, minlength=n_hubs).astype(np.int64)
    taking = want[classes_by_hub]
    hub_k = hub_of[classes_by_hub]
    before = np.cumsum(taking) - taking  # wanted by the earlier classes (and hubs) ...
    first_k = np.searchsorted(hub_k, hub_k)  # each hub's first class position
    before = before - before[first_k]  # ... of the hub
    taking = np.clip(before + taking, 0, room_of[hub_k]) - np.clip(before, 0, room_of[hub_k])
    # pad each hub's classes with its unwanted replicas, so both sides sum equal per hub
    unwanted = room_of - np.bincount(hub_k, weights=taking, minlength=n_hubs).astype(np.int64)
    side_c = np.concatenate([classes_by_hub, np.full(n_hubs, -1)])
    side_h = np.concatenate([hub_k, np.arange(n_hubs)])
    side_n = np.concatenate([taking, unwanted])
    order = np.lexsort((np.arange(len(side_h)), side_h))  # a hub's classes, then its pad
    side_c, side_n = side_c[order], side_n[order]
    ca, cb = np.cumsum(side_n), np.cumsum(room)
    cut = np.union1d(ca, cb)
    lo = np.concatenate([[0], cut[:-1]])
    keep = cut > lo
    lo, hi = lo[keep], cut[keep]
    k = side_c[np.searchsorted(ca, lo, side="right")]
    j = pools_by_hub[np.searchsorted(cb, lo, side="right")]
    real = k >= 0
    np.add.at(quotas, (cs[k[real]], out_p[j[real]]), (hi - lo)[real])
