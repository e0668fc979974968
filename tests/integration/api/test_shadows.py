"""Shadow traffic through the API (issue 18): the `shadow` setting, the shadow lane each
plane is given, its retirement, the plane's reports of it and the shadow report.

The world: one pool, clusters a and b; deployment `chat` placed 3 + 1 replicas there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.contracts import (
    DeploymentObserved,
    ObservedState,
    OutcomeCounters,
    ReplicaStatus,
)
from controlplane.db import models as m
from controlplane.db.columns import cluster_status
from controlplane.services.desired import desired_state
from controlplane.services.observed import DbSink
from tests.integration.api import builders as b
from tests.integration.api.test_rollouts import build_world

PLACED = {"a": 3, "b": 1}
SHADOW = {"share": 0.25, "replicas": 2, "engine_image": "vllm/vllm-openai:v0.33.0"}


@pytest.fixture
def world(admin, session_factory: sessionmaker[Session]):
    return build_world(admin, session_factory, b.deployment("chat"), PLACED)


def _set_shadow(api: Any, shadow: dict[str, Any] | None) -> dict[str, Any]:
    response = api.patch("deployments/chat", {"shadow": shadow})
    assert response.status_code == 200, response.text
    return response.json()


def _generations(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as s:
        return dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())


def _state(factory: sessionmaker[Session], cluster: str) -> Any:
    with factory() as s:
        return desired_state(s, s.scalars(select(m.Cluster).where(m.Cluster.name == cluster)).one())


# the setting -------------------------------------------------------------------------------


def test_the_shadow_reads_back_and_is_not_a_revision(world):
    changed = _set_shadow(world, SHADOW)
    assert changed["shadow"] == SHADOW
    assert changed["status"]["revision"] == 1
    assert world.get("deployments/chat").json()["shadow"] == SHADOW
    assert "shadow" not in _set_shadow(world, None)  # removed: no shadow shown
    assert world.get("deployments/chat").json()["status"]["revision"] == 1


@pytest.mark.parametrize(
    ("shadow", "field", "says"),
    [
        ({}, "shadow.share", "required"),
        ({"share": 0}, "shadow.share", "greater than 0"),
        ({"share": 1.5}, "shadow.share", "less than or equal to 1"),
        ({"share": 0.1, "replicas": 0}, "shadow.replicas", "greater than or equal to 1"),
        ({"share": 0.1, "replicas": 65}, "shadow.replicas", "64"),
        ({"share": 0.1, "gpus_per_replica": 2}, "shadow.gpus_per_replica", "unknown field"),
        ({"share": True}, "shadow.share", "number"),
    ],
)
def test_a_bad_shadow_is_a_422_naming_the_field(admin, shadow, field, says):
    b.seed(admin)
    response = admin.post("deployments", b.deployment("bad", shadow=shadow))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert field in errors, errors
    assert says in errors[field].lower()


def test_a_deployment_may_not_be_named_like_a_shadow_lane(admin):
    b.seed(admin)
    response = admin.post("deployments", b.deployment("chat--shadow"))
    assert response.status_code == 422
    assert "shadow lane" in response.text


# what the planes are given ------------------------------------------------------------------


def test_each_plane_gets_the_shadow_lane_and_loses_it_when_removed(world, session_factory):
    before = _generations(session_factory)
    _set_shadow(world, SHADOW)
    assert all(_generations(session_factory)[c] > before[c] for c in PLACED)
    for cluster in PLACED:
        entries = {d.name: d for d in _state(session_factory, cluster).deployments}
        assert set(entries) == {"chat", "chat--shadow"}
        lane, live = entries["chat--shadow"], entries["chat"]
        assert (lane.serves, lane.mirror, lane.traffic_share) == ("chat", True, 0.25)
        assert (lane.quota.min, lane.quota.max) == (2, 2)  # per cluster, whatever is placed
        assert lane.spec.engine_image == "vllm/vllm-openai:v0.33.0"
        assert lane.spec.model_id == live.spec.model_id
        assert lane.spec.revision.startswith("1-shadow-") and live.spec.revision == "1"
        assert lane.autoscaling.scale_to_zero_idle_seconds is None
        assert live.quota.max == PLACED[cluster] and not live.mirror  # the live entry as it was

    # more share: the same revision (no restart); another image: a new one
    first = _state(session_factory, "a").deployments[1].spec.revision
    _set_shadow(world, {**SHADOW, "share": 0.5})
    lane = _state(session_factory, "a").deployments[1]
    assert (lane.traffic_share, lane.spec.revision) == (0.5, first)
    _set_shadow(world, {**SHADOW, "engine_image": "vllm/vllm-openai:v0.34.0"})
    assert _state(session_factory, "a").deployments[1].spec.revision != first

    before = _generations(session_factory)
    _set_shadow(world, None)
    assert all(_generations(session_factory)[c] > before[c] for c in PLACED)
    state = _state(session_factory, "a")
    assert [d.name for d in state.deployments] == ["chat"]
    assert "chat--shadow" in state.retired  # drained at once
    _set_shadow(world, SHADOW)
    assert "chat--shadow" not in _state(session_factory, "a").retired


def test_a_deleted_deployments_shadow_lane_is_retired(world, session_factory):
    _set_shadow(world, SHADOW)
    assert world.delete("deployments/chat").status_code in (200, 204)
    assert "chat--shadow" in _state(session_factory, "a").retired


# what the planes report, and the report ------------------------------------------------------


def _counters(requests: int, errors: int = 0, slow: bool = False, dropped: int = 0) -> Any:
    at = [0, 0, 0, requests] + [0] * 9  # within 0.25 s
    if slow:
        at = [0] * 7 + [requests] + [0] * 5  # within 5 s
    return OutcomeCounters(since="r1", requests=requests, errors=errors, ttft_buckets=at,
                           e2e_buckets=at, dropped=dropped)  # fmt: skip


def _heartbeat(
    factory: sessionmaker[Session], cluster: str, live: OutcomeCounters, shadow: OutcomeCounters
) -> list[str]:
    report = ObservedState(
        cluster=cluster,
        source=f"cluster/{cluster}",
        replicas=[
            ReplicaStatus(
                replica_id=f"{cluster}-s", deployment="chat", revision="1", state="ready"
            ),
            ReplicaStatus(
                replica_id=f"{cluster}-m",
                deployment="chat--shadow",
                revision="1-shadow-x",
                state="ready",
            ),
        ],
        deployments=[
            DeploymentObserved(name="chat", demand=2, outcomes=live),
            DeploymentObserved(name="chat--shadow", demand=3, outcomes=shadow),
        ],
    )
    return DbSink(factory)._observed(cluster, report, datetime.now(UTC))[1]


def test_shadow_reports_pass_the_checks_and_add_no_demand(world, session_factory):
    _set_shadow(world, SHADOW)
    assert _heartbeat(session_factory, "a", _counters(100), _counters(25)) == []
    with session_factory() as s:
        entries = set(s.scalars(select(m.RouterOutcomes.entry)))
        assert entries == {"chat", "chat--shadow"}
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "a")).one()
        assert cluster_status(cluster).demand == {"chat": 2}  # the shadow's size is its spec's
        assert s.scalars(select(m.Deployment.demand_replicas)).one() == 2
        replicas = s.scalars(select(m.Replica.name)).all()
        assert replicas == ["a-s"]  # the shadow's replicas are not the deployment's


def test_the_shadow_report_puts_live_and_shadow_side_by_side(world, session_factory, viewer):
    assert viewer.get("deployments/chat/shadow").status_code == 404  # no shadow yet
    missing = viewer.get("deployments/nope/shadow")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")
    _set_shadow(world, SHADOW)  # before any report: the counters count whole
    _heartbeat(session_factory, "a", _counters(100), _counters(25, errors=5, slow=True, dropped=3))
    _heartbeat(session_factory, "b", _counters(20), _counters(5))
    report = viewer.get("deployments/chat/shadow")
    assert report.status_code == 200, report.text
    body = report.json()
    assert (body["deployment"], body["lane"], body["spec"]) == ("chat", "chat--shadow", SHADOW)
    assert body["clusters"] == ["a", "b"]
    live, shadow = body["live"], body["shadow"]
    assert (live["requests"], live["errors"], live["dropped"]) == (120, 0, 0)
    assert (live["p50_ttft_s"], live["p99_e2e_s"]) == (0.25, 0.25)
    assert (shadow["requests"], shadow["errors"], shadow["dropped"]) == (30, 5, 3)
    assert shadow["error_rate"] == pytest.approx(5 / 30)
    assert (shadow["p50_ttft_s"], shadow["p99_e2e_s"]) == (5.0, 5.0)  # 25 of 30 within 5 s

    # a change of the shadow starts the window again
    _set_shadow(world, {**SHADOW, "share": 0.5})
    _heartbeat(session_factory, "a", _counters(160), _counters(35, errors=5, slow=True, dropped=4))
    again = viewer.get("deployments/chat/shadow").json()
    assert (again["live"]["requests"], again["shadow"]["requests"]) == (60, 10)
    assert (again["shadow"]["errors"], again["shadow"]["dropped"]) == (0, 1)
    assert again["spec"]["share"] == 0.5
