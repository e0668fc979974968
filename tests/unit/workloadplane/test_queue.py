"""Admission queue: tiers, FIFO, bound, shedding, retries at the head, expiry (clock passed in)."""

from __future__ import annotations

import pytest

from workloadplane.queue import AdmissionQueue


def make_queue(max_length: int = 10, max_wait_s: float = 5.0) -> AdmissionQueue[str]:
    return AdmissionQueue(max_length, max_wait_s, tiers=3)


def drain(q: AdmissionQueue[str]) -> list[str]:
    return [q.pop().item for _ in range(len(q))]


def test_higher_tier_first_and_fifo_within_a_tier():
    q = make_queue()
    for item, tier in [("l1", 2), ("n1", 1), ("h1", 0), ("n2", 1), ("h2", 0), ("l2", 2)]:
        assert q.offer(item, tier, now=0).accepted
    assert drain(q) == ["h1", "h2", "n1", "n2", "l1", "l2"]


def test_full_queue_refuses_same_or_lower_tier():
    q = make_queue(max_length=2)
    q.offer("a", 1, 0)
    q.offer("b", 1, 0)
    assert not q.offer("c", 1, 0).accepted
    assert not q.offer("d", 2, 0).accepted
    assert len(q) == 2


def test_full_queue_sheds_newest_of_lowest_tier_for_a_higher_arrival():
    q = make_queue(max_length=3)
    q.offer("low-old", 2, 0)
    q.offer("low-new", 2, 1)
    q.offer("normal", 1, 2)
    offer = q.offer("high", 0, 3)
    assert offer.accepted and offer.shed is not None and offer.shed.item == "low-new"
    assert drain(q) == ["high", "normal", "low-old"]


def test_retry_goes_to_the_head_of_its_tier_even_when_full():
    q = make_queue(max_length=2)
    q.offer("a", 1, 0)
    q.offer("b", 1, 0)
    q.requeue("retried", 1, now=1)
    assert drain(q) == ["retried", "a", "b"]


def test_remove_and_expiry():
    q = make_queue(max_wait_s=5)
    a = q.offer("a", 1, now=0).entry
    q.offer("b", 1, now=3)
    q.offer("c", 0, now=4)
    assert a is not None and q.remove(a) and not q.remove(a)
    assert [e.item for e in q.expired(now=8.5)] == ["b"]
    assert drain(q) == ["c"]


def test_oldest_wait_and_retry_after():
    q = make_queue(max_wait_s=30)
    assert q.oldest_wait(now=10) == 0
    q.offer("a", 2, now=4)
    q.offer("b", 0, now=7)
    assert q.oldest_wait(now=10) == pytest.approx(6)
    assert q.retry_after_s(drain_rate_per_s=0) == 30
    assert q.retry_after_s(drain_rate_per_s=0.5) == 4
    assert q.retry_after_s(drain_rate_per_s=1000) == 1


def test_pop_from_empty_raises():
    with pytest.raises(IndexError):
        make_queue().pop()


def test_a_requeued_retry_is_never_shed_and_the_arrival_is_refused_instead():
    """A retry was sent to a replica once already: shedding it answered its client 429 for
    the replica's failure."""
    q = make_queue(max_length=3)
    q.offer("low", 2, 0)
    q.requeue("low-retry", 2, 1)  # at the head of its tier
    q.offer("normal", 1, 2)
    first = q.offer("high", 0, 3)
    assert first.accepted and first.shed is not None and first.shed.item == "low"
    second = q.offer("high-2", 0, 4)  # below it only the retry (tier 2) and "normal"
    assert second.accepted and second.shed is not None and second.shed.item == "normal"
    third = q.offer("high-3", 0, 5)  # only the retry left below: the arrival is refused
    assert not third.accepted and third.shed is None
    assert drain(q) == ["high", "high-2", "low-retry"]
