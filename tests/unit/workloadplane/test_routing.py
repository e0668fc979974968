"""Dispatch policy: least outstanding, limits, exclusions, LoRA and bounded-load prefix affinity."""

from __future__ import annotations

from collections import Counter

from workloadplane.health import ReplicaHealth
from workloadplane.routing import Candidate, HashRing, choose_replica


def fleet(
    *loads: int, limit: int = 4, adapters: dict[int, set[str]] | None = None
) -> list[Candidate]:
    adapters = adapters or {}
    return [Candidate(f"r{i}", load, limit, frozenset(adapters.get(i, set())))
            for i, load in enumerate(loads)]  # fmt: skip


def test_least_outstanding_wins():
    assert choose_replica(fleet(3, 1, 2)) == "r1"


def test_never_above_the_concurrency_limit():
    assert choose_replica(fleet(4, 4, limit=4)) is None
    assert choose_replica(fleet(4, 3, limit=4)) == "r1"


def test_excluded_replicas_are_skipped():
    assert choose_replica(fleet(0, 1, 2), exclude=frozenset({"r0", "r1"})) == "r2"


def test_ties_are_spread_by_tiebreak():
    picks = {choose_replica(fleet(0, 0, 0), tiebreak=i) for i in range(3)}
    assert picks == {"r0", "r1", "r2"}


def test_lora_adapter_prefers_replicas_that_have_it_loaded():
    replicas = fleet(3, 0, 1, adapters={0: {"sql"}, 2: {"sql"}})
    assert choose_replica(replicas, adapter="sql") == "r2"
    full = fleet(4, 0, 4, adapters={0: {"sql"}, 2: {"sql"}})
    assert choose_replica(full, adapter="sql") == "r1"  # nobody with it has room: any replica


def test_same_prefix_sticks_to_one_replica_while_load_allows():
    replicas = fleet(0, 0, 0, 0, limit=100)
    ring = HashRing(c.replica_id for c in replicas)
    picks = {choose_replica(replicas, affinity_key="system prompt A", ring=ring, tiebreak=i)
             for i in range(20)}  # fmt: skip
    assert len(picks) == 1


def test_a_prefix_with_a_lone_surrogate_sticks_like_any_other():
    # a JSON escape (\ud800) puts one in a prompt; strict UTF-8 cannot encode it (a 500)
    replicas = fleet(0, 0, 0, 0, limit=100)
    ring = HashRing(c.replica_id for c in replicas)
    picks = {choose_replica(replicas, affinity_key="chat\x1e\ud800" + "x" * 300, ring=ring,
                            tiebreak=i) for i in range(20)}  # fmt: skip
    assert len(picks) == 1 and None not in picks


def test_different_prefixes_spread_over_replicas():
    replicas = fleet(0, 0, 0, 0, limit=100)
    ring = HashRing(c.replica_id for c in replicas)
    picks = Counter(
        choose_replica(replicas, affinity_key=f"prefix {i}", ring=ring) for i in range(400)
    )
    assert set(picks) == {"r0", "r1", "r2", "r3"}
    assert max(picks.values()) < 2 * min(picks.values())


def test_bounded_load_moves_a_hot_prefix_off_an_overloaded_replica():
    replicas = fleet(0, 0, 0, 0, limit=100)
    ring = HashRing(c.replica_id for c in replicas)
    home = choose_replica(replicas, affinity_key="hot", ring=ring)
    loads = [10 if c.replica_id == home else 0 for c in replicas]
    busy = fleet(*loads, limit=100)
    # average load is (10+1)/4: the bound ceil(1.25 * 11 / 4) = 4 is far below 11
    assert choose_replica(busy, affinity_key="hot", ring=ring) != home


def test_ring_is_stable_when_a_replica_leaves():
    ring4 = HashRing(["r0", "r1", "r2", "r3"])
    ring3 = HashRing(["r0", "r1", "r2"])
    keys = [f"k{i}" for i in range(300)]
    moved = sum(next(ring4.walk(k)) != next(ring3.walk(k)) for k in keys
                if next(ring4.walk(k)) != "r3")  # fmt: skip
    assert moved == 0


def test_health_ejects_at_once_and_readmits_after_good_probes():
    h = ReplicaHealth(readmit_after=2)
    assert h.failed(now=1.0, reason="timeout") and h.ejected and h.ejected_at == 1.0
    assert not h.failed(now=1.5, reason="again")
    assert not h.probe_ok()
    assert h.failed(now=2.0, reason="flaky") is False and h.good_probes == 0
    assert not h.probe_ok() and h.probe_ok() and not h.ejected
    assert h.ejections == 1
