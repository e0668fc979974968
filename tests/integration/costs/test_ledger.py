"""The cost ledger on the real PostgreSQL: accrued from pools, instances and placements with
an injected clock, token usage from heartbeat counters, expiry events, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from controlplane.contracts import DeploymentObserved, TokenCounters
from controlplane.db import models as m
from controlplane.procurement.tasks import Deps
from controlplane.services import costs
from controlplane.settings import Settings
from controlplane.tasks import ACCRUE_COSTS, REPLAN, Worker, register
from tests.integration.api import builders as b

T0 = datetime(2026, 6, 1, 9, 30, tzinfo=UTC)
POLICY = costs.LedgerPolicy(max_gap=timedelta(hours=1), retention=timedelta(days=30))


def _tasks(session_factory: Any) -> Any:
    app = Celery("test-costs", set_as_current=False)
    deps = Deps(factory=session_factory, providers=lambda row: None, replan=lambda reason: None)  # type: ignore[arg-type]
    register(app, lambda: Worker(Settings(), deps))
    return app.tasks


def fleet(admin: Any, session_factory: Any) -> None:
    """A 16-GPU reservation at $2/GPU-h and an 8-GPU on-demand pool at $4; `chat-llm` placed
    with 2 replicas × 4 GPUs in the reservation."""
    for path, body in (
        ("providers", b.provider()),
        ("regions", b.region()),
        ("gpu-types", b.gpu_type()),
        (
            "pools",
            b.reserved_pool(
                "rsv",
                gpus=16,
                committed_gpus=16,
                price_per_gpu_hour="2",
                term_start="2026-01-01T00:00:00Z",
                term_end="2026-06-20T00:00:00Z",
            ),
        ),
        ("pools", b.pool("od", gpus=8, price_per_gpu_hour="4")),
        ("clusters", b.cluster(pools=["rsv", "od"])),
        (
            "deployments",
            b.deployment(gpus_per_replica=4, autoscaling={"min_replicas": 2, "max_replicas": 2}),
        ),
    ):
        response = admin.post(path, body)
        assert response.status_code == 201, response.text
    with session_factory() as s, s.begin():
        s.query(m.Cluster).filter_by(name="use1-a").one().state = "healthy"
    _tasks(session_factory)[REPLAN].run(reason="test")
    with session_factory() as s:
        placed = s.execute(
            select(m.Pool.name, m.Placement.replicas).join(m.Pool, m.Pool.id == m.Placement.pool_id)
        ).all()
    assert [tuple(p) for p in placed] == [("rsv", 2)], placed


def accrue(session_factory: Any, at: datetime) -> costs.Accrued:
    with session_factory() as s, s.begin():
        return costs.accrue(s, at, POLICY)


def ledger(session_factory: Any) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """(hour "MM-DD HH:MM", pool, deployment) → (held, used, cost)."""
    with session_factory() as s:
        rows = s.scalars(select(m.CostLedger)).all()
        return {
            (r.hour.astimezone(UTC).strftime("%m-%d %H:%M"), r.pool, r.deployment): (
                float(r.held_gpu_hours),
                float(r.used_gpu_hours),
                float(r.cost),
            )
            for r in rows
        }


def test_the_ledger_accrues_across_an_hour_by_deployment_and_idle(admin, session_factory):
    fleet(admin, session_factory)
    first = accrue(session_factory, T0)
    assert first.rows == 0  # the ledger starts now
    accrue(session_factory, T0 + timedelta(minutes=15))
    accrue(session_factory, T0 + timedelta(minutes=45))  # crosses 10:00
    got = ledger(session_factory)
    assert got[("06-01 09:00", "rsv", "chat-llm")] == pytest.approx((4.0, 4.0, 8.0))  # 8 GPUs × ½ h
    assert got[("06-01 09:00", "rsv", "")] == pytest.approx((4.0, 0.0, 8.0))  # 8 idle of 16
    assert got[("06-01 09:00", "od", "")] == pytest.approx((4.0, 0.0, 16.0))  # 8 held at $4
    assert got[("06-01 10:00", "rsv", "chat-llm")] == pytest.approx((2.0, 2.0, 4.0))  # ¼ h
    total = sum(cost for _, _, cost in got.values())
    assert total == pytest.approx(16 * 0.75 * 2 + 8 * 0.75 * 4)


@pytest.mark.parametrize("state", ["draining", "releasing", "running", "released"])
def test_an_instance_is_in_the_ledger_while_the_provider_bills_it(
    admin, session_factory, state: str
):
    """Only requested and running instances were counted: one draining (a pool in outage
    drains for as long as it lasts) or releasing (a delete the provider keeps refusing) was
    billed and charged $0."""
    fleet(admin, session_factory)
    with session_factory() as s, s.begin():
        od = s.scalars(select(m.Pool).where(m.Pool.name == "od")).one()
        s.add(m.Instance(pool_id=od.id, idempotency_key=f"k-{state}", gpus=8, state=state))
    accrue(session_factory, T0)
    accrue(session_factory, T0 + timedelta(minutes=30))
    held, _, cost = ledger(session_factory)[("06-01 09:00", "od", "")]
    extra = 0 if state == "released" else 8  # the pool's 8 declared GPUs, plus the instance's
    assert (held, cost) == pytest.approx(((8 + extra) * 0.5, (8 + extra) * 0.5 * 4))


def test_an_accrual_repeated_at_the_same_time_adds_nothing(admin, session_factory):
    fleet(admin, session_factory)
    accrue(session_factory, T0)
    accrue(session_factory, T0 + timedelta(minutes=10))
    before = ledger(session_factory)
    again = accrue(session_factory, T0 + timedelta(minutes=10))
    assert again.rows == 0
    assert ledger(session_factory) == before


def test_a_long_silence_is_charged_only_up_to_the_gap(admin, session_factory):
    fleet(admin, session_factory)
    accrue(session_factory, T0)
    done = accrue(session_factory, T0 + timedelta(hours=5))
    assert done.left_out == timedelta(hours=4)
    held = sum(h for h, _, _ in ledger(session_factory).values())
    assert held == pytest.approx(24.0)  # 16 + 8 GPUs for the last hour only


def test_reservation_expiry_is_warned_once_per_threshold(admin, session_factory):
    fleet(admin, session_factory)  # the reservation ends 2026-06-20
    assert accrue(session_factory, T0).warned == ["rsv"]  # 18.6 days: under 30
    assert accrue(session_factory, T0 + timedelta(minutes=1)).warned == []
    assert accrue(session_factory, datetime(2026, 6, 14, tzinfo=UTC)).warned == ["rsv"]  # < 7
    assert accrue(session_factory, datetime(2026, 6, 19, 1, tzinfo=UTC)).warned == ["rsv"]  # < 1
    assert accrue(session_factory, datetime(2026, 6, 20, tzinfo=UTC)).warned == ["rsv"]  # ended
    with session_factory() as s:
        events = s.scalars(
            select(m.Event).where(m.Event.type == "ReservationExpiring").order_by(m.Event.time)
        ).all()
    assert [e.data["days"] for e in events] == [30, 7, 1, 0]
    assert "renew it" in events[0].message
    # past its term the reservation is no longer paid: only what is placed there counts
    accrue(session_factory, datetime(2026, 6, 20, 0, 30, tzinfo=UTC))
    after = {
        k: v for k, v in ledger(session_factory).items() if k[0] == "06-20 00:00" and k[1] == "rsv"
    }
    assert sorted(k[2] for k in after) == ["chat-llm"]


def test_retention_drops_old_rows(admin, session_factory):
    fleet(admin, session_factory)
    accrue(session_factory, T0)
    accrue(session_factory, T0 + timedelta(minutes=30))
    assert ledger(session_factory)
    policy = costs.LedgerPolicy(max_gap=timedelta(hours=1), retention=timedelta(days=1))
    with session_factory() as s, s.begin():
        costs.accrue(s, T0 + timedelta(days=2), policy)
    with session_factory() as s:
        oldest = s.scalar(select(m.CostLedger.hour).order_by(m.CostLedger.hour).limit(1))
    assert oldest is not None and oldest >= T0 + timedelta(days=1)


def test_the_worker_task_accrues_and_drops_events_past_their_retention(admin, session_factory):
    """Events had no retention: a plane's facts and every capacity change added rows for as
    long as the fleet ran."""
    fleet(admin, session_factory)
    now = datetime.now(UTC)
    with session_factory() as s, s.begin():
        for name, age in (("old", timedelta(days=91)), ("recent", timedelta(days=89))):
            s.add(m.Event(time=now - age, type="Test", object_kind="cluster", object_name=name,
                          message="m"))  # fmt: skip
    task = _tasks(session_factory)[ACCRUE_COSTS]
    task.run()
    task.run()
    with session_factory() as s:
        assert s.get(m.CostAccrual, 1) is not None
        kept = s.scalars(select(m.Event.object_name).where(m.Event.type == "Test")).all()
    assert kept == ["recent"]  # the default retention: 90 days


def usage(since: str, inp: int, out: int, size: int, crossed: int = 0) -> list[DeploymentObserved]:
    counters = TokenCounters(since=since, input_tokens=inp, output_tokens=out,
                             response_bytes=size, cross_region_bytes=crossed)  # fmt: skip
    return [DeploymentObserved(name="chat-llm", usage=counters)]


def tokens(session_factory: Any) -> list[tuple[str, int, int, int]]:
    with session_factory() as s:
        rows = s.scalars(select(m.TokenUsage).order_by(m.TokenUsage.hour)).all()
        return [
            (
                r.hour.astimezone(UTC).strftime("%H:%M"),
                r.input_tokens,
                r.output_tokens,
                r.response_bytes,
            )
            for r in rows
        ]


def test_token_counters_become_hourly_usage_across_a_router_restart(session_factory, tokens_db):
    def report(at: datetime, since: str, inp: int, out: int, size: int) -> None:
        with session_factory() as s, s.begin():
            costs.record_usage(s, "use1-a", usage(since, inp, out, size), at, costs.UsageRates())

    report(T0, "r1", 1000, 200, 5000)
    report(T0 + timedelta(seconds=5), "r1", 1000, 200, 5000)  # a repeated heartbeat
    report(T0 + timedelta(minutes=10), "r1", 1500, 300, 7000)
    report(T0 + timedelta(minutes=40), "r2", 10, 20, 30)  # the router restarted (10:10)
    assert tokens(session_factory) == [("09:00", 1500, 300, 7000), ("10:00", 10, 20, 30)]


def test_a_report_adds_at_most_the_rate_bound_times_the_time_since_the_last(
    session_factory, tokens_db
):
    """A forged report may not move the ledger without limit, and an honest one after a long
    silence (the control plane down for hours) is not cut: the bound is per second since
    the deployment's last recorded report, not per report."""
    rates = costs.UsageRates(tokens_per_s=1000, bytes_per_s=10_000)

    def report(at: datetime, inp: int, size: int) -> None:
        with session_factory() as s, s.begin():
            costs.record_usage(s, "use1-a", usage("r1", inp, 0, size), at, rates)

    report(T0, 0, 0)
    report(T0 + timedelta(seconds=5), 10**12, 10**12)  # 5 s later: at most 5 s' worth
    report(T0 + timedelta(hours=2), 10**12 + 3_000_000, 10**12 + 30_000_000)  # 2 h of silence
    assert tokens(session_factory) == [
        ("09:00", 5000, 0, 50_000),
        ("11:00", 3_000_000, 0, 30_000_000),
    ]


@pytest.fixture
def tokens_db(tokens: dict[str, str]) -> dict[str, str]:
    """An empty database (the API suite's `tokens` fixture truncates every table)."""
    return tokens


def test_a_shadows_gpus_are_charged_to_its_deployment_not_to_idle(admin, session_factory):
    """A shadow (or a rollout's lane) runs beyond the placed replicas, bought or held for
    the deployment: it went to the pool's idle row."""
    fleet(admin, session_factory)
    shadowed = admin.patch("deployments/chat-llm", {"shadow": {"share": 0.1, "replicas": 1}})
    assert shadowed.status_code == 200, shadowed.text
    accrue(session_factory, T0)
    accrue(session_factory, T0 + timedelta(minutes=30))
    got = ledger(session_factory)
    assert got[("06-01 09:00", "rsv", "chat-llm")] == pytest.approx((6.0, 6.0, 12.0))  # 8 + 4
    assert got[("06-01 09:00", "rsv", "")] == pytest.approx((2.0, 0.0, 4.0))  # 4 idle of 16
