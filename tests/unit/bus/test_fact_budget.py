"""A cluster's fact budget (``controlplane.trust.ReportBudget``): a burst, then a rate; only
facts handled spend it — a redelivery that failed because the database was away does not
(a long outage would otherwise have the plane's real facts dropped once it ends)."""

from __future__ import annotations

from controlplane.trust import ReportBudget


def test_a_burst_then_the_rate_and_only_handled_facts_spend():
    budget = ReportBudget(per_s=2.0, burst=3.0)
    for _ in range(10):  # tried and failed (the database away): nothing spent
        assert budget.allows("a", 0.0)
    for _ in range(3):
        assert budget.allows("a", 0.0)
        budget.spend("a")
    assert not budget.allows("a", 0.0)
    assert budget.allows("b", 0.0)  # each cluster its own
    assert not budget.allows("a", 0.4)  # 0.8 of a fact refilled
    assert budget.allows("a", 0.5)
    budget.spend("a")
    assert not budget.allows("a", 0.5)
    assert budget.allows("a", 100.0) and budget.allows("a", 99.0)  # refills to the burst
    for _ in range(3):
        budget.spend("a")
    assert not budget.allows("a", 100.0)
