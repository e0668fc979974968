"""Pure dispatch policy: which replica gets the next request of a deployment.

Rules, in order: never a replica at its concurrency limit (or excluded: ejected, already
tried); LoRA affinity (replicas with the adapter loaded are preferred while one has room);
prefix affinity by consistent hashing with bounded load (a long shared prompt prefix lands
on the replica that has its KV cache, unless that replica carries more than ``load_factor``
times the average load); otherwise least outstanding requests, ties broken by ``tiebreak``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    replica_id: str
    outstanding: int
    limit: int
    adapters: frozenset[str] = frozenset()


def _hash(key: str) -> int:
    # surrogatepass: a key is request text, and a JSON escape can put a lone surrogate in
    # it, which strict UTF-8 refuses (that was a 500)
    data = key.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Consistent-hash ring over replica ids with ``vnodes`` points per replica."""

    def __init__(self, replica_ids: Iterable[str], vnodes: int = 64) -> None:
        points = sorted(
            (_hash(f"{rid}#{i}"), rid) for rid in set(replica_ids) for i in range(vnodes)
        )
        self._keys = [p[0] for p in points]
        self._ids = [p[1] for p in points]
        self.members = frozenset(self._ids)

    def walk(self, key: str) -> Iterator[str]:
        """Distinct replica ids in ring order, starting at ``key``'s position."""
        if not self._keys:
            return
        start = bisect.bisect(self._keys, _hash(key))
        seen: set[str] = set()
        n = len(self._keys)
        for i in range(n):
            rid = self._ids[(start + i) % n]
            if rid not in seen:
                seen.add(rid)
                yield rid
                if len(seen) == len(self.members):
                    return


def choose_replica(
    candidates: Sequence[Candidate],
    *,
    affinity_key: str | None = None,
    adapter: str | None = None,
    ring: HashRing | None = None,
    load_factor: float = 1.25,
    exclude: frozenset[str] = frozenset(),
    tiebreak: int = 0,
) -> str | None:
    """The replica for the next request, or None if every one is full or excluded."""
    eligible = [c for c in candidates if c.outstanding < c.limit and c.replica_id not in exclude]
    if not eligible:
        return None
    if adapter is not None:
        loaded = [c for c in eligible if adapter in c.adapters]
        if loaded:
            eligible = loaded
    if affinity_key is not None and len(eligible) > 1:
        picked = _bounded_hash_pick(candidates, eligible, affinity_key, ring, load_factor)
        if picked is not None:
            return picked
    least = min(c.outstanding for c in eligible)
    tied = [c for c in eligible if c.outstanding == least]
    return tied[tiebreak % len(tied)].replica_id


def _bounded_hash_pick(
    candidates: Sequence[Candidate],
    eligible: Sequence[Candidate],
    key: str,
    ring: HashRing | None,
    load_factor: float,
) -> str | None:
    by_id = {c.replica_id: c for c in eligible}
    if ring is None or not set(by_id) <= ring.members:
        ring = HashRing(c.replica_id for c in candidates)
    total = sum(c.outstanding for c in candidates) + 1
    bound = math.ceil(load_factor * total / len(candidates))
    for rid in ring.walk(key):
        c = by_id.get(rid)
        if c is not None and c.outstanding + 1 <= bound:
            return rid
    return None
