"""Blue-green rollouts through the API (issue 18): a full copy of the new revision beside the
stable one, the switch once every cluster's copy is ready, the keep window (an instant
rollback by an operator or a failed gate), and the promotion when it is over.

The world is test_rollouts.py's: one pool, clusters a and b, deployment `chat` placed 3 + 1
replicas there, its rollout strategy blue_green.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.contracts import DeploymentObserved, FreeCapacity, ObservedState, ReplicaStatus
from controlplane.db import models as m
from controlplane.services import rollouts
from controlplane.services.desired import desired_state
from controlplane.services.observed import DbSink
from tests.integration.api import builders as b
from tests.integration.api.test_rollouts import (
    PLACED,
    _counters,
    _entries,
    _generations,
    _new_revision,
    build_world,
)

BLUE_GREEN = {"strategy": "blue_green", "keep_seconds": 600, "gates": {"min_requests": 100}}


@pytest.fixture
def world(admin, session_factory: sessionmaker[Session]):
    return build_world(admin, session_factory, b.deployment("chat", rollout=BLUE_GREEN), PLACED)


def _report(
    factory: sessionmaker[Session],
    cluster: str,
    lane_ready: int,
    stable: int = 0,
    lane: int = 0,
    lane_errors: int = 0,
    lane_waiting: int = 0,
) -> None:
    """Cluster ``cluster`` reports its stable replicas ready, ``lane_ready`` of the lane's,
    and its router's counters for both entries."""
    replicas = [
        ReplicaStatus(replica_id=f"{cluster}-s{i}", deployment="chat", revision="1", state="ready")
        for i in range(PLACED[cluster])
    ] + [
        ReplicaStatus(
            replica_id=f"{cluster}-l{i}", deployment="chat--r2", revision="2", state="ready"
        )
        for i in range(lane_ready)
    ]
    report = ObservedState(
        cluster=cluster,
        source=f"cluster/{cluster}",
        replicas=replicas,
        free_capacity=[
            FreeCapacity(
                gpu_type="H100-80G", pool="p1", gpus=0, waiting_replicas={"chat--r2": lane_waiting}
            )
        ]
        if lane_waiting
        else [],
        deployments=[
            DeploymentObserved(name="chat", demand=1, outcomes=_counters(stable)),
            DeploymentObserved(name="chat--r2", demand=1, outcomes=_counters(lane, lane_errors)),
        ],
    )
    rejected = DbSink(factory)._observed(cluster, report, datetime.now(UTC))[1]
    assert rejected == []


def _tick(factory: sessionmaker[Session], later_s: float = 0.0) -> list[str]:
    with factory() as s, s.begin():
        return list(rollouts.tick(s, datetime.now(UTC) + timedelta(seconds=later_s)))


def _rollout(api: Any) -> dict[str, Any]:
    answer = api.get("deployments/chat/rollout")
    assert answer.status_code == 200, answer.text
    return answer.json()


def _retired(factory: sessionmaker[Session], cluster: str) -> list[str]:
    with factory() as s:
        row = s.scalars(select(m.Cluster).where(m.Cluster.name == cluster)).one()
        return desired_state(s, row).retired


def _switched(api: Any, factory: sessionmaker[Session]) -> dict[str, Any]:
    _new_revision(api)
    _report(factory, "a", lane_ready=3, stable=1000)
    _report(factory, "b", lane_ready=1, stable=200)
    assert _tick(factory) == ["chat"]
    return _rollout(api)


def test_a_bad_keep_window_is_a_422_naming_the_field(admin):
    b.seed(admin)
    for rollout, says in (
        ({"strategy": "blue_green", "keep_seconds": -1}, "greater than or equal to 0"),
        ({"strategy": "blue_green", "keep_seconds": 10**7}, "604800"),
    ):
        response = admin.post("deployments", b.deployment("bad", rollout=rollout))
        assert response.status_code == 422, response.text
        errors = {e["field"]: e["message"] for e in response.json()["errors"]}
        assert says in errors["rollout.keep_seconds"], errors


def test_a_full_copy_comes_up_beside_the_stable_revision_before_any_traffic_moves(
    world, session_factory
):
    _new_revision(world)
    started = _rollout(world)
    assert (started["strategy"], started["phase"], started["share"]) == (
        "blue_green",
        "scaling",
        0.0,
    )
    assert started["keep_seconds"] == 600 and started["keep_until"] is None
    a = _entries(session_factory, "a")
    assert a["chat"].spec.revision == "1" and a["chat"].quota.max == 3  # serves everything
    lane = a["chat--r2"]
    assert (lane.spec.revision, lane.traffic_share, lane.quota.min, lane.quota.max) == (
        "2",
        0.0,
        3,
        3,
    )
    assert _entries(session_factory, "b")["chat--r2"].quota.max == 1

    _report(session_factory, "a", lane_ready=3)
    _report(session_factory, "b", lane_ready=0, lane_waiting=1)  # no GPUs for the second copy
    assert _tick(session_factory) == []
    waiting = _rollout(world)
    assert waiting["phase"] == "scaling" and waiting["share"] == 0.0
    assert "waiting for 4 ready replicas of the new revision (3 now)" in waiting["reason"]
    assert waiting["reason"].endswith("replicas waiting for GPUs: 1 on b/p1")
    assert _entries(session_factory, "a")["chat--r2"].traffic_share == 0.0


def test_the_switch_moves_all_traffic_at_once_and_keeps_the_stable_revision_whole(
    world, session_factory
):
    before = _generations(session_factory)
    switched = _switched(world, session_factory)
    assert (switched["phase"], switched["share"]) == ("keeping", 1.0)
    assert switched["keep_until"] is not None
    assert switched["windows"]["before_switch"]["requests"] == 1200  # the gates' baseline
    assert all(_generations(session_factory)[c] > before[c] for c in PLACED)
    a = _entries(session_factory, "a")
    assert a["chat--r2"].traffic_share == 1.0 and a["chat--r2"].quota.max == 3
    assert a["chat"].spec.revision == "1" and a["chat"].quota.min == 3  # kept at full size
    assert a["chat"].autoscaling.scale_to_zero_idle_seconds is None
    events = world.get("events", type="RolloutSwitched").json()["items"]
    assert len(events) == 1 and "kept 600s" in events[0]["message"]


def test_a_rollback_during_the_keep_window_sends_everything_back_at_once(
    world, operator, session_factory
):
    _switched(world, session_factory)
    rolled = operator.post("deployments/chat/rollout/rollback", {})
    assert rolled.status_code == 200, rolled.text
    assert (rolled.json()["phase"], rolled.json()["share"]) == ("rolled_back", 0.0)
    for cluster in PLACED:
        entries = _entries(session_factory, cluster)
        assert list(entries) == ["chat"] and entries["chat"].spec.revision == "1"
        assert "chat--r2" in _retired(session_factory, cluster)
    chat = world.get("deployments/chat").json()
    assert (chat["status"]["revision"], chat["engine_image"]) == (1, "vllm/vllm-openai:v0.32.0")


def test_a_gate_failed_during_the_keep_window_rolls_back_by_itself(world, session_factory):
    _switched(world, session_factory)
    _report(session_factory, "a", lane_ready=3, stable=1000, lane=150, lane_errors=30)
    assert _tick(session_factory) == ["chat"]
    rollout = _rollout(world)
    assert rollout["phase"] == "rolled_back"
    assert rollout["reason"].startswith("gate failed: error rate 20.0%")
    assert list(_entries(session_factory, "a")) == ["chat"]


def test_when_the_keep_window_is_over_the_new_revision_is_promoted(world, session_factory):
    _switched(world, session_factory)
    _report(session_factory, "a", lane_ready=3, stable=1000, lane=500)
    assert _tick(session_factory, later_s=300) == []  # still keeping
    assert _tick(session_factory, later_s=601) == ["chat"]
    rollout = _rollout(world)
    assert (rollout["phase"], rollout["share"]) == ("promoted", 1.0)
    assert rollout["reason"] == "kept 600s: every gate passed"
    a = _entries(session_factory, "a")
    assert list(a) == ["chat"] and a["chat"].spec.revision == "2"  # the lane is adopted
    assert "chat--r2" in _retired(session_factory, "a")
    assert world.get("deployments/chat").json()["status"]["revision"] == 2


def test_the_dashboard_and_the_cli_show_the_keep_window(world, session_factory, app_client, tokens):
    from controlplane.cli.render import rollout_lines
    from controlplane.dashboard.session import COOKIE

    login = app_client.post("/login", data={"token": tokens["viewer"]}, follow_redirects=False)
    assert login.status_code == 303 and COOKIE in login.cookies
    assert "starts a blue-green rollout" in app_client.get("/deployments/chat").text
    switched = _switched(world, session_factory)
    page = app_client.get("/deployments/chat").text
    assert "Revision 1 → 2 (blue_green)" in page and "<strong>keeping</strong>" in page
    assert (
        "the old revision kept 600 s after the switch, until " + switched["keep_until"][:19] in page
    )
    shown = rollout_lines(switched)
    assert "Strategy:    blue_green" in shown and "Phase:       keeping" in shown
    assert f"600s at full size after the switch, until {switched['keep_until']}" in shown
    assert "Window before: 1200 requests" in shown
