"""`GET /api/v1/costs` on the real PostgreSQL: a ledger accrued with an injected clock, token
usage from heartbeat counters and API prices give the figures docs/cost.md promises; roles
and bad parameters get their 4xx, never a 500."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controlplane.services import costs
from tests.integration.costs.test_ledger import POLICY, T0, usage

WINDOW = {"from": "2026-06-01T09:00:00Z", "to": "2026-06-01T11:00:00Z"}


def accrue_hour(session_factory: Any) -> None:
    """The demo ledger: one hour, 09:30–10:30 (16 reserved GPUs at $2, 8 of them used by
    chat-llm; 8 on-demand GPUs at $4, idle), and 3 M input + 1 M output tokens."""
    for at in (T0, T0 + timedelta(minutes=30), T0 + timedelta(hours=1)):
        with session_factory() as s, s.begin():
            costs.accrue(s, at, POLICY)
    with session_factory() as s, s.begin():
        # 5 GB served, 2 GB of it through a gateway to clients in another region
        counters = usage("r1", 3_000_000, 1_000_000, 5 * 10**9, crossed=2 * 10**9)
        costs.record_usage(s, "use1-a", counters, T0, costs.UsageRates())


def test_costs_grouped_by_deployment_with_idle_apart(ledger, viewer):
    r = viewer.get("costs", **WINDOW)
    assert r.status_code == 200, r.text
    body = r.json()
    groups = {g["name"]: g for g in body["groups"]}
    assert groups["chat-llm"]["cost"] == pytest.approx(16.0)  # 8 GPUs × 1 h × $2
    assert groups["(idle)"]["cost"] == pytest.approx(16.0 + 32.0)  # 8 × $2 + 8 × $4
    assert body["total"]["cost"] == pytest.approx(64.0)
    assert body["total"]["held_gpu_hours"] == pytest.approx(24.0)
    assert body["total"]["used_gpu_hours"] == pytest.approx(8.0)
    assert [g["name"] for g in body["groups"]] == ["(idle)", "chat-llm"]  # by cost
    assert body["daily"] == [{"day": "2026-06-01", "costs": {"(idle)": 48.0, "chat-llm": 16.0}}]


@pytest.mark.parametrize(
    ("group_by", "expected"),
    [
        ("purchase_type", {"reserved": 32.0, "on_demand": 32.0}),
        ("purchase-type", {"reserved": 32.0, "on_demand": 32.0}),
        ("provider", {"aws-main": 64.0}),
        ("cluster", {"use1-a": 16.0, "(idle)": 48.0}),
        ("pool", {"rsv": 32.0, "od": 32.0}),
    ],
)
def test_costs_by_each_grouping(ledger, viewer, group_by, expected):
    body = viewer.get("costs", group_by=group_by, **WINDOW).json()
    assert {g["name"]: g["cost"] for g in body["groups"]} == pytest.approx(expected)


def test_reservation_burn_down_and_idle(ledger, viewer):
    (rsv,) = viewer.get("costs", **WINDOW).json()["reservations"]
    assert rsv["pool"] == "rsv"
    assert rsv["paid_gpu_hours"] == pytest.approx(16.0)
    assert rsv["used_gpu_hours"] == pytest.approx(8.0)
    assert rsv["idle_fraction"] == pytest.approx(0.5)
    assert rsv["idle_cost"] == pytest.approx(16.0)
    term = datetime(2026, 6, 20, tzinfo=UTC) - datetime(2026, 1, 1, tzinfo=UTC)
    assert rsv["term_gpu_hours"] == pytest.approx(16 * term / timedelta(hours=1))


def test_dollars_per_mtok_next_to_the_api_price_with_the_break_even(ledger, viewer):
    (chat,) = viewer.get("costs", **WINDOW).json()["tokens"]
    assert (chat["input_tokens"], chat["output_tokens"]) == (3_000_000, 1_000_000)
    assert chat["dollars_per_mtok"] == pytest.approx(16.0 / 4)
    (api,) = chat["api_prices"]
    assert api["api_cost"] == pytest.approx(3 * 2.5 + 1 * 10)  # 17.5
    assert api["saving"] == pytest.approx(17.5 - 16.0)
    blended = (3 * 2.5 + 1 * 10) / 4  # $/Mtok at this deployment's 3:1 mix
    assert api["break_even_tokens"] == pytest.approx(16.0 / blended * 1e6, abs=1)


def test_tco_lines_follow_the_settings(ledger, app_client, tokens):
    settings = app_client.app.state.settings
    before = settings.model_copy()
    settings.cost_egress_dollars_per_gb = 0.09
    settings.cost_engineering_dollars_per_month = 30437.5  # $1,000 a day
    try:
        r = app_client.get(
            "/api/v1/costs",
            params=WINDOW,
            headers={"Authorization": f"Bearer {tokens['viewer']}"},
        )
    finally:
        app_client.app.state.settings = before
    tco = r.json()["tco"]
    assert tco["gpu"] == pytest.approx({"reserved": 32.0, "on_demand": 32.0, "spot": 0.0})
    lines = {line["name"]: line for line in tco["lines"]}
    assert lines["data_transfer"]["cost"] == pytest.approx(2 * 0.09)  # the 2 GB that crossed
    assert "2,000,000,000 of the 5,000,000,000 bytes" in lines["data_transfer"]["note"]
    assert lines["engineering"]["cost"] == pytest.approx(1000 * 2 / 24)
    assert lines["storage"]["cost"] == 0
    assert tco["total"] == pytest.approx(64 + 0.18 + 1000 / 12)


def test_the_default_window_is_the_last_week(ledger, viewer):
    body = viewer.get("costs").json()
    start = datetime.fromisoformat(body["from"])
    end = datetime.fromisoformat(body["to"])
    assert end - start == timedelta(days=7)
    assert body["group_by"] == "deployment"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"from": "2026-06-02T00:00:00Z", "to": "2026-06-01T00:00:00Z"}, "to"),
        ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"to": "9999-12-31T23:59:59Z"}, "to"),
        ({"from": "0001-01-01T00:00:00"}, "from"),
        ({"group_by": "region"}, "group_by"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
    ],
)
def test_bad_parameters_are_a_422_naming_the_parameter(viewer, params, field):
    r = viewer.get("costs", **params)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == [field]


def test_a_non_number_limit_is_a_422_too(viewer):
    r = viewer.get("costs", limit="many")
    assert r.status_code == 422
    assert "limit" in r.json()["errors"][0]["field"]


def test_costs_need_a_token(app_client, tokens):
    r = app_client.get("/api/v1/costs")
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")


def test_groups_beyond_the_limit_sum_as_other(ledger, viewer):
    body = viewer.get("costs", group_by="pool", limit="1", **WINDOW).json()
    assert [(g["name"], g["cost"]) for g in body["groups"]] == [("od", 32.0), ("(other)", 32.0)]
    assert body["daily"][0]["costs"] == {"od": 32.0, "(other)": 32.0}


def test_api_prices_are_operator_written_and_viewer_read(ledger, viewer, operator):
    assert viewer.get("api-prices").json()["items"][0]["name"] == "hosted-llama-8b"
    body = {"name": "x", "model_id": "m", "input_price_per_mtok": "1", "output_price_per_mtok": "1"}
    assert viewer.post("api-prices", body).status_code == 403
    assert operator.post("api-prices", body).status_code == 201
    bad = operator.post("api-prices", body | {"name": "y", "input_price_per_mtok": "-1"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "input_price_per_mtok"


def test_what_moving_work_onto_the_idle_reservation_would_save(ledger, viewer, session_factory):
    from sqlalchemy import select

    from controlplane.db import models as m

    settled = viewer.get("costs", **WINDOW).json()["rebalance"]
    assert settled["saving_per_hour"] == 0 and settled["moved_replicas"] == 0
    assert settled["reserved_idle_gpus_now"] == 8  # 16 reserved, chat-llm's 2 × 4 on it
    # an older placement, from before the reservation had room: chat-llm on on-demand
    with session_factory() as s, s.begin():
        od = s.scalars(select(m.Pool).where(m.Pool.name == "od")).one()
        s.scalars(select(m.Placement)).one().pool_id = od.id
    stale = viewer.get("costs", **WINDOW).json()["rebalance"]
    assert stale["on_demand_and_spot_per_hour_now"] == 32.0  # 8 on-demand GPUs at $4
    assert stale["on_demand_and_spot_per_hour_fresh"] == 0.0
    assert stale["saving_per_hour"] == 32.0
    assert (stale["reserved_idle_gpus_now"], stale["reserved_idle_gpus_fresh"]) == (16, 8)
    assert stale["moved_replicas"] == 2
    assert stale["unplaced_replicas_now"] == stale["unplaced_replicas_fresh"] == 0
