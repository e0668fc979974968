"""Admission queue of one deployment: priority tiers, FIFO within a tier, bounded length.

Pure: no clock reads, no I/O — callers pass ``now``. Tier 0 is the highest priority. When the
queue is full, an arrival of a higher tier sheds the newest entry of the lowest tier below
it (that one gets a 429), otherwise the arrival itself is refused. A retried request goes
back to the head of its tier (``requeue``), ignoring the bound: it was admitted already,
and it is never shed (it was sent once; a 429 now would turn the replica's failure into the
client's) — if only requeued entries are below the arrival, the arrival is refused.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Waiting(Generic[T]):
    item: T
    tier: int
    enqueued_at: float
    seq: int = field(default=0)
    requeued: bool = False
    """Put back by ``requeue`` (a retry): never shed."""


@dataclass(frozen=True, slots=True)
class Offer(Generic[T]):
    """Outcome of ``offer``: accepted or not, and an entry shed to make room (if any)."""

    accepted: bool
    entry: Waiting[T] | None = None
    shed: Waiting[T] | None = None


class AdmissionQueue(Generic[T]):
    def __init__(self, max_length: int, max_wait_s: float, tiers: int = 3) -> None:
        if tiers < 1:
            raise ValueError("a queue needs at least one tier")
        self.max_length = max_length
        self.max_wait_s = max_wait_s
        self.tiers = tiers
        self._tiers: list[OrderedDict[int, Waiting[T]]] = [OrderedDict() for _ in range(tiers)]
        self._seq = itertools.count()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def depth(self, tier: int) -> int:
        return len(self._tiers[tier])

    def _tier(self, tier: int) -> int:
        return min(max(tier, 0), self.tiers - 1)

    def offer(self, item: T, tier: int, now: float) -> Offer[T]:
        """Append ``item`` to the tail of its tier, if the bound allows."""
        tier = self._tier(tier)
        shed: Waiting[T] | None = None
        if self._len >= self.max_length:
            shed = self._sheddable(tier)
            if shed is None:
                return Offer(False)
            del self._tiers[shed.tier][shed.seq]
            self._len -= 1
        entry = Waiting(item, tier, now, next(self._seq))
        self._tiers[tier][entry.seq] = entry
        self._len += 1
        return Offer(True, entry, shed)

    def _sheddable(self, tier: int) -> Waiting[T] | None:
        """The newest entry that was never requeued, in the lowest tier below ``tier``
        that has one."""
        for lower in range(self.tiers - 1, tier, -1):
            for entry in reversed(self._tiers[lower].values()):
                if not entry.requeued:
                    return entry
        return None

    def requeue(self, item: T, tier: int, now: float) -> Waiting[T]:
        """Put an admitted item back at the head of its tier (a retry), bound or not."""
        entry = Waiting(item, self._tier(tier), now, next(self._seq), requeued=True)
        queue = self._tiers[entry.tier]
        queue[entry.seq] = entry
        queue.move_to_end(entry.seq, last=False)
        self._len += 1
        return entry

    def peek(self) -> Waiting[T] | None:
        for tier in self._tiers:
            if tier:
                return next(iter(tier.values()))
        return None

    def pop(self) -> Waiting[T]:
        for tier in self._tiers:
            if tier:
                self._len -= 1
                return tier.popitem(last=False)[1]
        raise IndexError("pop from an empty admission queue")

    def remove(self, entry: Waiting[T]) -> bool:
        """Take ``entry`` out (its client gave up or its wait timed out); False if not queued."""
        if self._tiers[entry.tier].pop(entry.seq, None) is None:
            return False
        self._len -= 1
        return True

    def expired(self, now: float) -> list[Waiting[T]]:
        """Remove and return the entries that have waited longer than ``max_wait_s``."""
        out: list[Waiting[T]] = []
        for tier in self._tiers:
            for entry in list(tier.values()):
                if now - entry.enqueued_at > self.max_wait_s:
                    del tier[entry.seq]
                    out.append(entry)
        self._len -= len(out)
        return out

    def oldest_wait(self, now: float) -> float:
        oldest = min((next(iter(t.values())).enqueued_at for t in self._tiers if t), default=now)
        return now - oldest

    def retry_after_s(self, drain_rate_per_s: float) -> int:
        """A ``Retry-After`` hint: time to drain the queue at the observed rate, 1..60 s."""
        if drain_rate_per_s <= 0:
            return max(1, min(60, round(self.max_wait_s)))
        return max(1, min(60, round(self._len / drain_rate_per_s)))
