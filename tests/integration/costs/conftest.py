"""The demo ledger both the API and the CLI tests read (docs/cost.md's figures)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.costs.test_costs_api import accrue_hour
from tests.integration.costs.test_ledger import fleet


@pytest.fixture
def ledger(admin: Any, session_factory: Any) -> Any:
    fleet(admin, session_factory)
    accrue_hour(session_factory)
    price = {
        "name": "hosted-llama-8b",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "input_price_per_mtok": "2.50",
        "output_price_per_mtok": "10",
        "source": "example API, June 2026",
    }
    assert admin.post("api-prices", price).status_code == 201
    return admin
