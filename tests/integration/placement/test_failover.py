"""Active-passive failover on the real database: the standby is validated, placed, priced,
kept warm at its size on its plane, and shown by the API (issue 15)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from controlplane.services.desired import desired_state
from controlplane.services.inventory import Actor
from controlplane.services.manifests import apply_manifests
from controlplane.services.placement import load_world, replan

pytestmark = pytest.mark.integration

STANDBY = {"mode": "active_passive", "standby_cluster": "usw2-a", "standby_replicas": 1}


def _pool(name: str, region: str, price: str, gpus: int = 16) -> dict[str, Any]:
    return {
        "kind": "Pool",
        "name": name,
        "provider": "aws",
        "region": region,
        "gpu_type": "H100-80G",
        "purchase_type": "on_demand",
        "gpus": gpus,
        "price_per_gpu_hour": price,
        "quota_gpus": gpus,
    }


def failover_fleet(failover: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Three regions (two US, one DE), one cluster each (the DE one without an endpoint),
    and `chat` (US only, min 2) with `failover` (default: a standby on usw2-a)."""
    regions = [("use1", "US", 38.9, -77.4), ("usw2", "US", 45.5, -122.7), ("euc1", "DE", 50.1, 8.7)]
    docs: list[dict[str, Any]] = [
        {"kind": "Provider", "name": "aws", "provider_kind": "aws",
         "provider_class": "hyperscaler", "certifications": ["SOC2", "HIPAA"]},
        {"kind": "GpuType", "name": "H100-80G", "memory_gib": 80},
    ]  # fmt: skip
    for name, jurisdiction, lat, lon in regions:
        docs.append(
            {"kind": "Region", "name": name, "provider": "aws", "code": name,
             "jurisdiction": jurisdiction, "latitude": lat, "longitude": lon}
        )  # fmt: skip
        docs.append(_pool(f"{name}-h100", name, "3.00" if name == "use1" else "4.00"))
        cluster: dict[str, Any] = {
            "kind": "Cluster",
            "name": f"{name}-a",
            "region": name,
            "pools": [f"{name}-h100"],
        }
        if name != "euc1":
            cluster["endpoint"] = f"http://127.0.0.1:{8100 + len(docs)}"
        docs.append(cluster)
    docs.append(
        {
            "kind": "Deployment",
            "name": "chat",
            "model_id": "m/chat",
            "gpus_per_replica": 1,
            "gpu_types": ["H100-80G"],
            "autoscaling": {"min_replicas": 2, "max_replicas": 4},
            "placement": {"allowed_jurisdictions": ["US"]},
            "failover": STANDBY if failover is None else failover,
        }
    )
    return docs


def load_fleet(factory: sessionmaker[Session], docs: list[dict[str, Any]]) -> None:
    with factory() as s, s.begin():
        apply_manifests(s, docs, Actor("test"))
        s.execute(update(m.Cluster).values(state="healthy"))


@pytest.fixture
def fleet(admin, session_factory):
    load_fleet(session_factory, failover_fleet())
    return admin


def _rows(factory: sessionmaker[Session]) -> dict[str, tuple[int, int, int]]:
    with factory() as s:
        rows = s.execute(
            select(m.Cluster.name, m.Placement.replicas, m.Placement.min_replicas,
                   m.Placement.max_replicas).join(m.Cluster, m.Cluster.id == m.Placement.cluster_id)
        ).all()  # fmt: skip
    return {name: (n, low, high) for name, n, low, high in rows}


def test_the_standby_is_placed_priced_and_kept_warm_at_its_size(fleet, operator, session_factory):
    assert operator.post("placement/replan", {}).status_code == 200

    # actives on the cheapest US plane, the standby on its own plane, fixed at one replica
    assert _rows(session_factory) == {"use1-a": (2, 2, 2), "usw2-a": (1, 1, 1)}
    status = fleet.get("deployments/chat").json()["status"]["placement"]
    assert status["placed_replicas"] == 2 and status["standby_replicas"] == 1
    assert status["standby"] == [{"cluster": "usw2-a", "pool": "usw2-h100", "replicas": 1}]
    assert [a["cluster"] for a in status["assignments"]] == ["use1-a"]
    assert status["cost_per_hour"] == f"{2 * 3.0 + 1 * 4.0:.6f}"  # the standby is paid for
    assert fleet.get("placement").json()["deployments"]["chat"]["standby_replicas"] == 1

    with session_factory() as s:
        plane = s.scalars(select(m.Cluster).where(m.Cluster.name == "usw2-a")).one()
        (chat,) = desired_state(s, plane).deployments
    assert (chat.quota.min, chat.quota.max) == (1, 1)  # its autoscaler cannot scale it away
    assert chat.autoscaling.scale_to_zero_idle_seconds is None
    assert chat.autoscaling.schedule == []


def test_switching_back_to_active_active_drops_the_standby(fleet, operator, session_factory):
    operator.post("placement/replan", {})
    patched = operator.patch("deployments/chat", {"failover": {"mode": "active_active"}})
    assert patched.status_code == 200, patched.text
    operator.post("placement/replan", {})
    rows = _rows(session_factory)
    assert sum(n for n, _, _ in rows.values()) == 2 and "usw2-a" not in rows
    assert fleet.get("deployments/chat").json()["status"]["placement"]["standby"] == []


@pytest.mark.parametrize(
    ("failover", "field", "words"),
    [
        ({"mode": "active_passive", "standby_cluster": "nope"}, "failover.standby_cluster",
         "no cluster named 'nope'"),
        ({"mode": "active_passive", "standby_cluster": "euc1-a"}, "failover.standby_cluster",
         "outside placement.allowed_jurisdictions"),
        ({"mode": "active_passive", "standby_cluster": None}, "failover", "needs standby_cluster"),
        (STANDBY | {"standby_replicas": 0}, "failover.standby_replicas", "greater than or equal"),
        (STANDBY | {"standby_replicas": 65}, "failover.standby_replicas", "less than or equal"),
        (STANDBY | {"hold_down_seconds": -1}, "failover.hold_down_seconds", "greater than"),
        ({"mode": "hot_spare"}, "failover.mode", "active_active"),
    ],
)  # fmt: skip
def test_a_bad_failover_is_a_clear_422(fleet, operator, failover, field, words):
    response = operator.patch("deployments/chat", {"failover": failover})
    assert response.status_code == 422, response.text
    body = response.json()
    assert response.headers["content-type"].startswith("application/problem+json")
    assert any(e["field"] == field and words in e["message"] for e in body["errors"]), body


def test_a_standby_missing_a_certification_is_refused(fleet, operator):
    body = {"placement": {"required_certifications": ["ISO27001"]}}
    response = operator.patch("deployments/chat", body)
    assert response.status_code == 422, response.text
    assert "lacks ISO27001" in response.text


def test_the_standby_cluster_cannot_be_deleted_from_under_its_deployment(fleet, operator):
    response = operator.delete("clusters/usw2-a")
    assert response.status_code == 409, response.text
    assert "failover.standby_cluster of `chat`" in response.json()["detail"]


def test_the_standby_does_not_count_as_active_demand(fleet, session_factory):
    """Ten active replicas wanted by the planes' demand, plus the standby: re-planning keeps
    ten (the standby counted as placed would pull the demand's deadband up to eleven)."""
    with session_factory() as s, s.begin():
        s.execute(
            update(m.Deployment).values(
                demand_replicas=10, autoscaling={"min_replicas": 2, "max_replicas": 20}
            )
        )
        assert replan(s, "test") is not None
    first = _rows(session_factory)
    assert first == {"use1-a": (10, 2, 10), "usw2-a": (1, 1, 1)}
    with session_factory() as s:
        generations = dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())
        world = load_world(s)
    (chat,) = world.input.deployments
    assert chat.wanted_replicas == 10
    assert {a.deployment for a in world.input.current} == {"chat", "chat/standby"}
    for _ in range(2):
        with session_factory() as s, s.begin():
            replan(s, "test")
    assert _rows(session_factory) == first
    with session_factory() as s:
        again = dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())
    assert again == generations  # nothing moved: no plane is told anything new
