"""The cost gauges of the API's /metrics, read from the ledger on the real PostgreSQL with
the collector's clock injected (the ledger's last 24 hours)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from controlplane.api.fleetmetrics import FleetCollector
from tests.integration.costs.test_costs_api import accrue_hour
from tests.integration.costs.test_ledger import T0, fleet


def samples(session_factory: Any, at: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    collector = FleetCollector(session_factory, now=lambda: at)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def value(got: dict, name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


def test_the_last_days_cost_reservations_and_dollars_per_mtok(admin, session_factory):
    fleet(admin, session_factory)
    accrue_hour(session_factory)  # 09:30–10:30: $64, of which chat-llm $16; 4 M tokens
    got = samples(session_factory, T0 + timedelta(hours=2))
    chat = {"deployment": "chat-llm", "cluster": "use1-a", "provider": "aws-main",
            "pool": "rsv", "purchase_type": "reserved"}  # fmt: skip
    assert value(got, "gpufleet_cost_last_day_dollars", **chat) == pytest.approx(16.0)
    assert value(got, "gpufleet_cost_last_day_used_gpu_seconds", **chat) == pytest.approx(8 * 3600)
    idle = chat | {"deployment": "(idle)", "cluster": "(idle)"}
    assert value(got, "gpufleet_cost_last_day_held_gpu_seconds", **idle) == pytest.approx(8 * 3600)
    paid = value(got, "gpufleet_reservation_last_day_paid_gpu_seconds", pool="rsv")
    used = value(got, "gpufleet_reservation_last_day_used_gpu_seconds", pool="rsv")
    assert (paid, used) == (pytest.approx(16 * 3600), pytest.approx(8 * 3600))
    per_mtok = "gpufleet_deployment_last_day_dollars_per_million_tokens"
    assert value(got, per_mtok, deployment="chat-llm") == pytest.approx(4.0)
    tokens = "gpufleet_deployment_last_day_tokens"
    assert value(got, tokens, deployment="chat-llm", direction="input") == 3_000_000
    accrued = value(got, "gpufleet_cost_ledger_accrued_timestamp_seconds")
    assert accrued == (T0 + timedelta(hours=1)).timestamp()


def test_a_day_later_the_window_is_empty_but_reservations_still_report(admin, session_factory):
    fleet(admin, session_factory)
    accrue_hour(session_factory)
    got = samples(session_factory, T0 + timedelta(days=2))
    assert not [k for k in got if k[0] == "gpufleet_cost_last_day_dollars"]
    assert value(got, "gpufleet_reservation_last_day_paid_gpu_seconds", pool="rsv") == 0
    assert not [k for k in got if k[0] == "gpufleet_deployment_last_day_dollars_per_million_tokens"]
