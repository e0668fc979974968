"""The worker's metrics: procurement outcomes by provider and a re-plan's unplaced replicas."""

from __future__ import annotations

from prometheus_client import REGISTRY

from controlplane.procurement.tasks import Outcome
from controlplane.tasks import unplaced_replicas


def _outcomes(provider: str, action: str, outcome: str, error: str) -> float:
    labels = {"provider": provider, "action": action, "outcome": outcome, "error": error}
    return REGISTRY.get_sample_value("gpufleet_procurement_outcomes_total", labels) or 0.0


def test_procurement_outcomes_are_counted_by_provider_outcome_and_error_class():
    before = [
        _outcomes("gcp-main", "acquire", "ok", "none"),
        _outcomes("gcp-main", "acquire", "failed", "QuotaExceeded"),
        _outcomes("aws-main", "release", "throttled", "Throttled"),
    ]
    Outcome(acquired=["i-1"], provider="gcp-main").count("acquire")
    Outcome(error="QuotaExceeded", provider="gcp-main").count("acquire")
    Outcome(error="Throttled", retry=True, provider="aws-main").count("release")
    Outcome().count("release")  # nothing asked of a provider (the pool was gone): not counted
    after = [
        _outcomes("gcp-main", "acquire", "ok", "none"),
        _outcomes("gcp-main", "acquire", "failed", "QuotaExceeded"),
        _outcomes("aws-main", "release", "throttled", "Throttled"),
    ]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]
    assert _outcomes("", "release", "ok", "none") == 0


def test_unplaced_replicas_sum_over_every_deployment_of_a_summary():
    summary = {
        "deployments": {
            "a": {"unplaced": [{"replicas": 2, "reason": "no room"}, {"replicas": 1}]},
            "b": {"unplaced": []},
            "c": {},
        }
    }
    assert unplaced_replicas(summary) == 3
    assert unplaced_replicas({}) == 0
