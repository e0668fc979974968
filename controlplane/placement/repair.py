"""Phases after the greedy fill: make room by moving others, displace by priority, improve.

- make_room: for a replica that fits nowhere, find a compatible pool where moving one or a
  few replicas of other deployments to pools with room frees enough GPUs (an ejection
  chain of depth one). This is what fixes both constraint crowding (a flexible deployment
  sat in the only pool a restricted one can use) and GPU-count fragmentation.
- displace: a higher-priority replica evicts lower-priority ones; the victims are re-placed
  elsewhere if possible and otherwise reported as displaced.
- improve: move replicas to cheaper pools with room; a replica kept from the current
  placement moves only when it saves more than the churn cost.
- swap: exchange two (non-kept) replicas of one size between pools where that saves.
Every move is checked against the victim's static constraints, spot budget and spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from controlplane.placement.packing import (
    INF,
    Plan,
    candidates,
    enforce_spot,
    enforce_spread,
    fill,
    spread_filter,
    spread_need,
    spread_ok,
)

SPREAD = ("min_distinct_providers", "min_distinct_regions")

# pools examined per stuck replica, cheapest first. 32 instead of 8 (session 11, with the
# `_may_free` precheck): on the 8 cases of seeds 7, 11, 13 where the bench found GPUs
# unplaced above the optimum, 23 GPUs over it in all instead of 68, 4 cases at it, for
# +0.00-0.09 CPU s of place(); 64: 12 over, +0.1-0.2 s; 128: 8 over, +0.1-0.45 s.
# 64 since session 14, when the notes per victim and per pool had halved make_room's
# time: over 48 fleets (seeds 7, 11, 13, 21, 23, 29; four families; 70 and 92 %) 33 GPUs
# fewer left out than with 32 (seed 11 60/92 % at the optimum), for +0.02-0.03 CPU s
# at one shape per deployment (make_room 0.04 -> 0.06 s); 128: 12 fewer again, +0.05 s
MAX_ROOM_POOLS = 64
MAX_TARGETS = 4  # target pools tried per moved replica


def smallest(values: np.ndarray, k: int) -> np.ndarray:
    """np.argsort(values, kind="stable")[:k] (ties by position) without sorting them all."""
    if len(values) <= k:
        return np.argsort(values, kind="stable")
    cut = np.partition(values, k - 1)[k - 1]  # the k-th smallest value
    below = np.flatnonzero(values < cut)
    at = np.flatnonzero(values == cut)[: k - len(below)]  # the first ones, by position
    chosen = np.concatenate([below, at])
    return chosen[np.argsort(values[chosen], kind="stable")]


def _room_for(plan: Plan, e: int) -> np.ndarray:
    """e's admissible pools that had room for one more replica of e when the room last
    grew: a superset of those with room now (room only shrinks between removals), so
    that none, or none but the pool being emptied, means no move. Kept per shape (size,
    admissible pools) in plan.room_notes until the next removal."""
    t = plan.t
    key = plan.room_keys.get(e)
    if key is None:  # masks live in Tables' cache: ids stay valid
        key = plan.room_keys[e] = (id(t.compat(e)), plan.size(e))
    hit = plan.room_notes.get(key)
    if hit is not None and hit[0] == plan.removals:
        return hit[1]
    idx = t.compat_index(e)  # e's admissible pools: the search is over those only
    pools = idx[t.cap[idx] - plan.used[idx] >= key[1]]
    plan.room_notes[key] = (plan.removals, pools)
    return pools


def _room_now(plan: Plan, e: int) -> np.ndarray:
    """e's admissible pools with room for one more replica of e now; the shape's note is
    narrowed to them (still a superset until the next removal)."""
    t = plan.t
    pools = _room_for(plan, e)
    if len(pools):
        room = t.cap[pools] - plan.used[pools] >= plan.size(e)
        if not room.all():
            pools = pools[room]
            plan.room_notes[plan.room_keys[e]] = (plan.removals, pools)
    return pools


def _targets(plan: Plan, e: int, p: int) -> np.ndarray:
    """The pools one replica of e in p may move to now: admissible, with room, not p, not
    spot unless e's spot budget allows."""
    t = plan.t
    pools = _room_now(plan, e)
    ok = pools != p
    spot = t.is_spot[pools]
    # leaving spot gives one unit of budget back
    if spot[ok].any() and plan.spot_budget(e) + int(t.is_spot[p]) <= 0:
        ok &= ~spot
    return pools[ok]


def _may_move(plan: Plan, e: int, p: int) -> bool:
    """Might one replica of e in p move to another pool now? True whenever `_targets`
    finds one (not only then: adds since the note may have taken the room or e's spot
    budget; `_move_one` checks exactly). Noted per deployment until the next removal, as
    the same victims come up for pool after pool of every stuck replica."""
    t = plan.t
    hit = plan.move_notes.get(e)
    if hit is None or hit[0] != plan.removals:
        pools = _room_now(plan, e)
        spot = t.is_spot[pools]
        budget = plan.spot_budget(e) if spot.any() else 1
        hit = plan.move_notes[e] = (plan.removals, pools, pools[~spot], budget)
    _stamp, pools, on_demand, budget = hit
    usable = pools if budget + int(t.is_spot[p]) > 0 else on_demand  # leaving spot: +1
    return len(usable) > 1 or (len(usable) == 1 and usable[0] != p)


def _move_one(plan: Plan, e: int, p: int) -> int | None:
    """Move one replica of e out of pool p to the cheapest admissible pool; return it."""
    targets = _targets(plan, e, p)
    if not len(targets):
        return None
    cost = plan.t.cost(e)[targets]
    for i in np.argsort(cost, kind="stable")[:MAX_TARGETS]:
        q = int(targets[i])
        stamp = plan.removals
        plan.remove(e, p, 1)
        plan.add(e, q, 1)
        if spread_ok(plan, e) and plan.spot_budget(e) >= 0:
            return q
        plan.remove(e, q, 1)
        plan.add(e, p, 1)
        plan.removals = stamp  # undone: the room is as it was
    return None


def _may_free(plan: Plan, p: int, need: int, protect: int) -> bool:
    """Could moving others' replicas out of p free `need` GPUs there at all? False when
    the room plus every replica that may move (not kept, with a pool to go to) falls
    short: `_free_pool` would try them all and fail (moving others out of p gives room
    in p only, where they cannot go).

    Noted per pool until the next removal (plan.free_notes: the room plus each member's
    movable GPUs): adds only lower that sum (a replica added to p takes at least the room
    it could give back; one added elsewhere takes room or spot budget from p's members),
    so the note errs only towards trying, and `_free_pool` checks every move."""
    note = plan.free_notes.get(p)
    if note is None or note[0] != plan.removals:
        t = plan.t
        parts: dict[int, int] = {}
        for e, n in plan.members[p].items():
            movable = n - plan.kept[e].get(p, 0)
            if movable > 0 and _may_move(plan, e, p):
                parts[e] = movable * plan.size(e)
        total = int(t.cap[p] - plan.used[p]) + sum(parts.values())
        note = plan.free_notes[p] = (plan.removals, total, parts)
    _stamp, total, parts = note
    return total - parts.get(protect, 0) >= need


def _free_pool(plan: Plan, p: int, need: int, protect: int) -> list[tuple[int, int, int]] | None:
    """Move replicas of others out of p until `need` GPUs are free there; None if it can't."""
    if not _may_free(plan, p, need, protect):
        return None
    stamp = plan.removals
    moves: list[tuple[int, int, int]] = []
    victims = sorted(
        (e for e in plan.members[p] if e != protect),
        key=lambda e: (plan.size(e) < need, plan.size(e), e),
    )
    for e in victims:
        # replicas kept from the current placement are not moved for others (churn)
        while (
            plan.alloc[e].get(p, 0) > plan.kept[e].get(p, 0) and plan.t.cap[p] - plan.used[p] < need
        ):
            q = _move_one(plan, e, p)
            if q is None:
                break
            moves.append((e, p, q))
        if plan.t.cap[p] - plan.used[p] >= need:
            return moves
    for e, src, q in reversed(moves):
        plan.remove(e, q, 1)
        plan.add(e, src, 1)
    plan.removals = stamp  # all undone: the room is as it was
    return None


def make_room(plan: Plan, d: int) -> bool:
    """Free a compatible pool for one more replica of d by moving others; True if done.

    The pools: admissible ones without room, adding a provider/region while d spans
    fewer than its policy asks."""
    for p in _full_pools(plan, d, MAX_ROOM_POOLS):
        if _free_pool(plan, p, plan.size(d), protect=d) is not None:
            return True
    return False


def _full_pools(plan: Plan, d: int, most: int) -> list[int]:
    """d's admissible pools without room for one more of its replicas but big enough for
    one, adding a provider/region while d spans fewer than its policy asks, within its spot
    budget: the ``most`` cheapest."""
    t = plan.t
    s = plan.size(d)
    idx = t.compat_index(d)
    spread, _unmet = spread_filter(plan, d, np.zeros(len(idx)), idx)
    ok = np.isfinite(spread) & (t.cap[idx] - plan.used[idx] < s) & (t.cap[idx] >= s)
    if plan.spot_budget(d) <= 0:
        ok &= ~t.is_spot[idx]
    cost = np.where(ok, t.cost(d)[idx], INF)
    return [int(idx[i]) for i in smallest(cost, most) if math.isfinite(cost[i])]


def place_hard(plan: Plan, d: int, k: int) -> int:
    """fill(), then make room for what is left, then displace lower priority; returns placed."""
    placed = fill(plan, d, k)
    dep = plan.t.inp.deployments[d]
    # the first eviction for d may break a victim's spread, later ones not (in this call
    # or a later one: plan.repaired)
    movable = True  # moving others may still make room: false once it found none, since
    # evicting for d frees room only where d then goes (the victims leave the plan)
    while placed < k and (plan.blocked.get(d) == "capacity" or plan.blocked.get(d) in SPREAD):
        shape = (dep.gpus_per_replica, id(plan.t.compat(d)), plan.spot_budget(d) > 0, dep.priority)
        by_capacity = plan.blocked.get(d) == "capacity"
        if by_capacity and shape in plan.no_room:
            break
        movable = movable and make_room(plan, d)
        if (
            movable
            or displace(plan, d, harmful_ok=d not in plan.repaired)
            or move_and_displace(plan, d)
        ):
            got = fill(plan, d, 1)
            if got == 0:
                break
            placed += got
            plan.repaired.add(d)
            if placed < k:  # what is left, and why not (a placed replica clears `blocked`)
                placed += fill(plan, d, k - placed)
        else:
            if by_capacity:
                plan.no_room.add(shape)
            break
    return placed


def place_again(plan: Plan, short: list[int]) -> None:
    """Deployments above the lowest priority among ``short`` get the repair again: room
    made by moving others or by evicting lower priorities. Used for those the spot or
    spread rule trimmed (a fill had put replicas where the rule cannot hold, e.g. a second
    one on the same provider when the others were full: now the rule is in force), and at
    the end for those still short (improve may have moved a lower priority into room they
    could take). The evicted are re-homed where room is left."""
    deps = plan.t.inp.deployments
    lowest = plan.t.lowest_priority
    again = [
        d for d in short if deps[d].priority > lowest and plan.placed(d) < deps[d].target_replicas
    ]
    if not again:
        return
    place_short(plan, again, place_hard)
    # whom they evicted, if above the lowest priority, may in turn evict lower ones (as
    # in the first pass, where a victim's own turn comes later in the priority order)
    victims = [e for e in plan.displaced if deps[e].priority > lowest]
    place_short(plan, sorted(victims, key=lambda e: (-deps[e].priority, e)), place_hard)
    rehome_displaced(plan)


def enforce_rules(plan: Plan, ds: list[int]) -> list[int]:
    """The spot and spread rules enforced on each of ``ds`` that holds replicas; returns
    those it trimmed (in ``ds``'s order)."""
    trimmed = []
    for d in ds:
        if plan.alloc[d]:
            before = plan.placed(d)
            enforce_spot(plan, d)
            enforce_spread(plan, d)
            if plan.placed(d) < before:
                trimmed.append(d)
    return trimmed


def place_short(plan: Plan, ds: list[int], how: Callable[[Plan, int, int], int]) -> None:
    """Each of ``ds`` still short of its target places what it misses with ``how`` (fill,
    or fill and repair); the rules are enforced again where it placed any."""
    deps = plan.t.inp.deployments
    for d in ds:
        missing = deps[d].target_replicas - plan.placed(d)
        if missing > 0 and how(plan, d, missing):
            enforce_spot(plan, d)
            enforce_spread(plan, d)


def displace(plan: Plan, d: int, harmful_ok: bool = True) -> bool:
    """Evict lower-priority replicas from the cheapest pool where that frees room for d,
    preferring pools and victims where no victim's spread rule breaks (a victim left on
    one provider would lose all but one replica)."""
    t = plan.t
    if t.inp.deployments[d].priority <= t.lowest_priority:
        return False  # nobody ranks below d
    s = plan.size(d)
    idx = t.compat_index(d)
    ok = t.cap[idx] >= s
    if plan.spot_budget(d) <= 0:
        ok &= ~t.is_spot[idx]
    spread, _unmet = spread_filter(plan, d, np.zeros(len(idx)), idx)
    ok &= np.isfinite(spread)  # while d spans too few providers (regions): a new one
    cost = np.where(ok, t.cost(d)[idx], INF)
    ranked = [int(idx[i]) for i in np.argsort(cost, kind="stable") if math.isfinite(cost[i])]
    pools = _evictable(plan, d, ranked)
    for harmless in (True, False) if harmful_ok else (True,):
        for p in pools:
            victims = _victims(plan, d, p, harmless)
            if victims is not None:
                for e in victims:
                    plan.remove(e, p, 1)
                    by = plan.displaced.setdefault(e, {})
                    by[d] = by.get(d, 0) + 1
                return True
    return False


# pools of d examined by move_and_displace, cheapest first, and target pools per replica
# moved out of one
MAX_CHAIN_POOLS = 32
MAX_CHAIN_TARGETS = 8

# a chain's steps, to undo: (mover, from, to, kept there before) or (victim, pool, -1, kept)
Step = tuple[int, int, int, int]


def move_and_displace(plan: Plan, d: int) -> bool:
    """Room for one replica of d in one of its pools by moving others' replicas out of it
    into pools where evicting replicas of lower priority than d makes theirs: a chain of
    two steps, for when neither moving into room (make_room) nor evicting in d's own pools
    (displace) frees a whole replica — e.g. d's pools full of higher priorities and lower
    ones only in 1- and 2-GPU pieces, never a whole 4-GPU replica's worth in one pool,
    while those higher priorities' other pools hold lower-priority replicas enough.
    Victims are evicted only where their spread rule survives."""
    t = plan.t
    if t.inp.deployments[d].priority <= t.lowest_priority:
        return False  # nobody ranks below d
    return any(_chain_out(plan, p, d) for p in _full_pools(plan, d, MAX_CHAIN_POOLS))


def _chain_out(plan: Plan, p: int, d: int) -> bool:
    """Free one replica of d's GPUs in p by moving others out (into room, else evicting
    below d's priority where they go); everything undone if it cannot."""
    t = plan.t
    need = plan.size(d)
    movable = {e: n - plan.kept[e].get(p, 0) for e, n in plan.members[p].items() if e != d}
    if int(t.cap[p] - plan.used[p]) + sum(n * plan.size(e) for e, n in movable.items()) < need:
        return False
    stamp = plan.removals
    steps: list[Step] = []
    for e in sorted(movable, key=lambda e: (plan.size(e) < need, plan.size(e), e)):
        for _ in range(movable[e]):
            if t.cap[p] - plan.used[p] >= need:
                break
            q = _move_one(plan, e, p)
            if q is not None:
                steps.append((e, p, q, plan.kept[e].get(p, 0)))
            elif not _move_evicting(plan, e, p, d, steps):
                break
        if t.cap[p] - plan.used[p] >= need:
            for v, _src, to, _kept in steps:
                if to < 0:
                    by = plan.displaced.setdefault(v, {})
                    by[d] = by.get(d, 0) + 1
            return True
    for e, src, to, kept in reversed(steps):
        if to >= 0:
            plan.remove(e, to, 1)
        plan.add(e, src, 1)
        if kept:
            plan.kept[e][src] = kept
    plan.removals = stamp  # all undone: the room is as it was
    return False


def _move_evicting(plan: Plan, e: int, p: int, d: int, steps: list[Step]) -> bool:
    """Move one replica of e out of p into one of its pools where evicting replicas of
    lower priority than d (never d's or e's, never breaking a victim's spread) makes room;
    the steps are appended to ``steps``."""
    t = plan.t
    deps = t.inp.deployments
    prio, s = deps[d].priority, plan.size(e)
    idx = t.compat_index(e)
    ok = (idx != p) & (t.cap[idx] >= s)
    if plan.spot_budget(e) + int(t.is_spot[p]) <= 0:
        ok &= ~t.is_spot[idx]
    cost = np.where(ok, t.cost(e)[idx], INF)
    tried = 0
    for i in np.argsort(cost, kind="stable"):
        if not math.isfinite(cost[i]) or tried == MAX_CHAIN_TARGETS:
            return False
        q = int(idx[i])
        victims = _lower(plan, q, prio, s - int(t.cap[q] - plan.used[q]), (d, e))
        if victims is None:
            continue
        tried += 1
        mark = len(steps)
        for v in victims:
            steps.append((v, q, -1, plan.kept[v].get(q, 0)))
            plan.remove(v, q, 1)
        steps.append((e, p, q, plan.kept[e].get(p, 0)))
        plan.remove(e, p, 1)
        plan.add(e, q, 1)
        if spread_ok(plan, e) and plan.spot_budget(e) >= 0:
            return True
        for v, src, to, kept in reversed(steps[mark:]):
            if to >= 0:
                plan.remove(v, to, 1)
            plan.add(v, src, 1)
            if kept:
                plan.kept[v][src] = kept
        del steps[mark:]
    return False


def _lower(plan: Plan, q: int, prio: int, need: int, spare: tuple[int, ...]) -> list[int] | None:
    """Replicas in q (one entry per replica) of priority below ``prio``, not of ``spare``,
    whose eviction frees ``need`` GPUs without breaking a spread rule; None if none do."""
    if need <= 0:
        return []
    deps = plan.t.inp.deployments
    lower = sorted(
        (e for e in plan.members[q] if deps[e].priority < prio and e not in spare),
        key=lambda e: (deps[e].priority, plan.size(e), e),
    )
    out: list[int] = []
    for e in lower:
        for n in range(1, plan.members[q][e] + 1):
            if _breaks_spread(plan, e, q, n):
                break
            out.append(e)
            need -= plan.size(e)
            if need <= 0:
                return out
    return None


def _evictable(plan: Plan, d: int, ranked: list[int]) -> list[int]:
    """The first MAX_ROOM_POOLS pools of ``ranked`` (cheapest first, admissible) whose room
    plus lower-priority replicas would fit one replica of d. Searched over all of d's pools,
    not only its cheapest: those are where the LP put the higher priorities, and a replica
    of priority 1 was left out while priority-0 replicas held its dearer pools. (Taking
    pools that need only the lowest priority's victims first was tried: a priority-2
    replica then took the priority-0 victims a priority-1 one needed, 86 GPUs of priority 1
    left out on one case instead of 0.)"""
    deps = plan.t.inp.deployments
    prio, s = deps[d].priority, plan.size(d)
    cap, used, members = plan.t.cap, plan.used, plan.members
    out: list[int] = []
    for p in ranked:
        room = int(cap[p] - used[p])
        for e, n in members[p].items():
            if room >= s:
                break
            if deps[e].priority < prio:
                room += n * plan.size(e)
        if room >= s:
            out.append(p)
            if len(out) == MAX_ROOM_POOLS:
                break
    return out


def _victims(plan: Plan, d: int, p: int, harmless: bool) -> list[int] | None:
    """Lower-priority replicas (one entry per replica) to evict from p to fit one of d."""
    t = plan.t
    deps = t.inp.deployments
    prio = deps[d].priority
    need = plan.size(d) - int(t.cap[p] - plan.used[p])
    lower = sorted(
        (e for e in plan.members[p] if deps[e].priority < prio),
        key=lambda e: (deps[e].priority, _breaks_spread(plan, e, p), plan.size(e), e),
    )
    out: list[int] = []
    for e in lower:
        for n in range(1, plan.members[p][e] + 1):
            if need <= 0:
                return out
            if harmless and _breaks_spread(plan, e, p, n):
                break
            out.append(e)
            need -= plan.size(e)
    return out if need <= 0 else None


def _breaks_spread(plan: Plan, e: int, p: int, n: int = 1) -> bool:
    """Would removing n replicas of e from pool p leave e spanning too few providers or
    regions for what it keeps?"""
    t = plan.t
    alloc = plan.alloc[e]
    left = plan.placed(e) - n
    kp, kr = spread_need(plan, e, left)
    provs = {int(t.pool_provider[q]) for q, k in alloc.items() if k - n * (q == p) > 0}
    regs = {int(t.pool_region[q]) for q, k in alloc.items() if k - n * (q == p) > 0}
    return len(provs) < kp or len(regs) < kr


def rehome_displaced(plan: Plan, only: set[int] | None = None) -> None:
    """Give displaced replicas (those of ``only`` if given) another pool if one has room
    (then they merely moved)."""
    deps = plan.t.inp.deployments
    todo = plan.displaced if only is None else [e for e in plan.displaced if e in only]
    for e in sorted(todo, key=lambda e: (-deps[e].priority, e)):
        # a victim may have won its replicas back already (its own turn came later):
        # only what it still misses is lost, and never more than that is re-placed
        missing = max(deps[e].target_replicas - plan.placed(e), 0)
        lost = min(sum(plan.displaced[e].values()), missing)
        back = sum(plan.displaced[e].values()) - lost + (fill(plan, e, lost) if lost else 0)
        left: dict[int, int] = {}
        for by in sorted(plan.displaced[e]):  # what came back clears the first displacers
            take = min(back, plan.displaced[e][by])
            back -= take
            if plan.displaced[e][by] > take:
                left[by] = plan.displaced[e][by] - take
        if left:
            plan.displaced[e] = left
        else:
            del plan.displaced[e]


Settled = dict[int, tuple[int, dict[int, int]]]


def improve(plan: Plan, order: list[int], passes: int = 8, settled: Settled | None = None) -> None:
    """Move replicas into cheaper pools with room until no move saves enough.

    ``settled`` (kept across calls): (plan.removals, d's pools) when d last found no
    cheaper pool: while d holds the same and none of its admissible pools cheaper than
    its dearest has gained room since (a replica removed there), it would find none again
    (others' moves change nothing else it looks at)."""
    t = plan.t
    churn = t.inp.weights.churn_cost_per_gpu_hour
    settled = {} if settled is None else settled
    for _ in range(passes):
        moved = False
        for d in order:
            if not plan.alloc[d]:
                continue
            seen = settled.get(d)
            if seen is not None and seen[1] == plan.alloc[d]:
                since = seen[0]
                if since == plan.removals:
                    continue
                idx = t.compat_index(d)
                cost = t.cost(d)
                dearest = max(cost[p] for p in plan.alloc[d])
                if not ((plan.freed_at[idx] > since) & (cost[idx] < dearest)).any():
                    continue
            if _improve_one(plan, d, churn):
                moved = True
            else:
                settled[d] = (plan.removals, dict(plan.alloc[d]))
        if not moved:
            return


def _improve_one(plan: Plan, d: int, churn: float) -> bool:
    t = plan.t
    s = plan.size(d)
    cost = t.cost(d)
    moved = False
    for p in sorted(plan.alloc[d], key=lambda p: (-cost[p], p)):
        while p in plan.alloc[d]:
            kept = plan.kept[d].get(p, 0) > 0
            pools, best = candidates(plan, d, exclude=p)
            i = int(np.argmin(best)) if len(pools) else -1  # the first cheapest, as by pool
            if i < 0 or not best[i] < cost[p] - (churn if kept else 1e-9):
                if not kept:  # no pool with room is cheaper, nor for d's cheaper pools
                    return moved
                break
            q = int(pools[i])
            n = min(plan.alloc[d][p], int(t.cap[q] - plan.used[q]) // s)
            if kept:
                n = min(n, plan.kept[d][p])
            if t.is_spot[q] and not t.is_spot[p]:
                n = min(n, plan.spot_budget(d))
            if n <= 0:
                break
            plan.remove(d, p, n)
            plan.add(d, q, n)
            if not spread_ok(plan, d):
                plan.remove(d, q, n)
                plan.add(d, p, n)
                break
            moved = True
    return moved


# the cheapest admissible pools examined per replica that swap() tries to move. 16 (8):
# one shape per deployment at 70 %, seed 11, +0.59 % over the LP bound -> +0.49 % (+0.51 %),
# seed 7 +0.48 -> +0.39 % (+0.41 %), for ~0.06-0.08 CPU s of place()
SWAP_POOLS = 16


def swap_and_improve(plan: Plan, order: list[int]) -> None:
    """`improve`, then `swap`, then `improve` again where that can find more: a swap
    leaves every pool's room as it was, so only the deployments it moved can have new
    cheaper pools, until one of them moves into room (which `improve` then follows)."""
    settled: Settled = {}
    improve(plan, order, settled=settled)
    moved = swap(plan, order)
    if not moved:
        return
    for d, (_since, held) in settled.items():
        if d not in moved:
            settled[d] = (plan.removals, held)
    improve(plan, order, settled=settled)


def swap(plan: Plan, order: list[int]) -> set[int]:
    """Exchange two replicas of the same size between two pools when that lowers the cost:
    d's replica in p goes to a cheaper pool q and a replica of e goes from q to p. Moving
    one replica into room (`improve`) cannot do this when the cheaper pools are full, as
    at 70 % load they are: the LP fills them. The pools' GPUs stay as they are; kept
    replicas do not move; spread and spot rules are checked after each exchange. Returns
    the deployments that moved."""
    t = plan.t
    sizes = [dep.gpus_per_replica for dep in t.inp.deployments]
    moved: set[int] = set()
    for d in order:
        if not plan.alloc[d]:
            continue
        cost_d = t.cost(d)
        idx = t.compat_index(d)
        cheapest = idx[smallest(cost_d[idx], SWAP_POOLS)].tolist()
        low = float(cost_d[cheapest[0]]) if cheapest else INF
        for p in sorted(plan.alloc[d], key=lambda p: (-cost_d[p], p)):
            if cost_d[p] > low + 1e-9:  # in its cheapest pool a replica has nothing to gain
                _swap_out(plan, d, p, sizes, cheapest, moved)
    return moved


def _swap_out(
    plan: Plan, d: int, p: int, sizes: list[int], cheapest: list[int], moved: set[int]
) -> None:
    """Swap d's movable replicas in p with replicas in the cheapest of its pools
    (``cheapest``, cheapest first) while an exchange saves."""
    t = plan.t
    s = sizes[d]
    cost_d = t.cost(d)
    here = float(cost_d[p])
    cheaper = [(q, here - float(cost_d[q])) for q in cheapest if cost_d[q] < here - 1e-9]
    members, kept, compat, cost = plan.members, plan.kept, t.compat, t.cost  # hot loop
    while cheaper and plan.alloc[d].get(p, 0) > kept[d].get(p, 0):
        best: tuple[float, int, int] | None = None
        for q, saved in cheaper:
            for e, n in members[q].items():
                if sizes[e] != s or e == d or n <= kept[e].get(q, 0) or not compat(e)[p]:
                    continue
                cost_e = cost(e)
                gain = saved - float(cost_e[p] - cost_e[q])
                if gain > 1e-9 and (best is None or gain > best[0]):
                    best = (gain, q, e)
        if best is None:
            return
        _gain, q, e = best
        plan.remove(d, p, 1)
        plan.remove(e, q, 1)
        plan.add(d, q, 1)
        plan.add(e, p, 1)
        if (
            not (spread_ok(plan, d) and spread_ok(plan, e))
            or min(plan.spot_budget(d), plan.spot_budget(e)) < 0
        ):
            plan.remove(d, q, 1)
            plan.remove(e, p, 1)
            plan.add(d, p, 1)
            plan.add(e, q, 1)
            return
        moved.update((d, e))
