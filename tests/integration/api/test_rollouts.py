"""Canary rollouts through the API (issue 18): the `rollout` spec, the rollout a revision
change starts, the commands, and what the planes are given meanwhile.

The world: one pool, clusters a and b; deployment `chat` placed 3 + 1 replicas there (as a
re-plan would write them), its rollout strategy canary with a short hold.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.contracts import (
    DeploymentObserved,
    FreeCapacity,
    ObservedState,
    OutcomeCounters,
    ReplicaStatus,
    TokenCounters,
)
from controlplane.db import models as m
from controlplane.db.columns import cluster_status
from controlplane.procurement.tasks import Deps
from controlplane.services import rollouts
from controlplane.services.desired import desired_state
from controlplane.services.observed import DbSink
from controlplane.settings import Settings
from controlplane.tasks import ROLLOUTS, Worker, register
from tests.integration.api import builders as b

CANARY = {"strategy": "canary", "steps": [0.25, 1.0], "hold_seconds": 0}
PLACED = {"a": 3, "b": 1}


def _place(factory: sessionmaker[Session], deployment: str, placed: dict[str, int]) -> None:
    with factory() as s, s.begin():
        dep = s.scalars(select(m.Deployment.id).where(m.Deployment.name == deployment)).one()
        pool = s.scalars(select(m.Pool.id)).one()
        for cluster, replicas in placed.items():
            cid = s.scalars(select(m.Cluster.id).where(m.Cluster.name == cluster)).one()
            s.add(
                m.Placement(
                    deployment_id=dep,
                    cluster_id=cid,
                    pool_id=pool,
                    replicas=replicas,
                    min_replicas=1,
                    max_replicas=replicas,
                )
            )
        s.execute(update(m.Cluster).values(desired_generation=5, state="healthy"))


def build_world(admin, factory: sessionmaker[Session], deployment: dict, placed: dict[str, int]):
    """One pool shared by clusters a and b, ``deployment`` created and placed ``placed``."""
    for path, body in (
        ("providers", b.provider()),
        ("regions", b.region()),
        ("gpu-types", b.gpu_type()),
        ("pools", b.pool("p1")),
        ("clusters", b.cluster("a", pools=["p1"])),
        ("clusters", b.cluster("b", pools=["p1"])),
        ("deployments", deployment),
    ):
        response = admin.post(path, body)
        assert response.status_code == 201, response.text
    _place(factory, deployment["name"], placed)
    return admin


@pytest.fixture
def world(admin, session_factory: sessionmaker[Session]):
    return build_world(admin, session_factory, b.deployment("chat", rollout=CANARY), PLACED)


def _new_revision(api: Any, image: str = "vllm/vllm-openai:v0.33.0") -> Any:
    response = api.patch("deployments/chat", {"engine_image": image})
    assert response.status_code == 200, response.text
    return response.json()


def _generations(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as s:
        return dict(s.execute(select(m.Cluster.name, m.Cluster.desired_generation)).all())


def _entries(factory: sessionmaker[Session], cluster: str) -> dict[str, Any]:
    with factory() as s:
        row = s.scalars(select(m.Cluster).where(m.Cluster.name == cluster)).one()
        return {d.name: d for d in desired_state(s, row).deployments}


# the spec ----------------------------------------------------------------------------------


def test_the_rollout_spec_defaults_to_canary_and_reads_back(admin):
    b.seed(admin)
    created = admin.post("deployments", b.deployment("plain")).json()
    assert created["rollout"] == {
        "strategy": "canary",
        "steps": [0.05, 0.25, 0.5, 1.0],
        "hold_seconds": 300.0,
        "keep_seconds": 600.0,
        "gates": {
            "min_requests": 100,
            "max_error_rate_increase": 0.01,
            "max_p99_ttft_ratio": 1.5,
            "max_p99_e2e_ratio": 1.5,
        },
    }
    changed = admin.patch("deployments/plain", {"rollout": {"strategy": "immediate"}})
    assert changed.status_code == 200 and changed.json()["rollout"]["strategy"] == "immediate"
    assert changed.json()["status"]["revision"] == 1  # not a revision field


@pytest.mark.parametrize(
    ("rollout", "field", "says"),
    [
        ({"steps": [0.5, 0.25, 1.0]}, "rollout.steps", "rise"),
        ({"steps": [0.1, 0.5]}, "rollout.steps", "end at 1.0"),
        ({"steps": [0, 1.0]}, "rollout.steps[0]", "greater than 0"),
        ({"steps": [0.01 * i for i in range(1, 18)] + [1.0]}, "rollout.steps", "at most"),
        ({"strategy": "rolling"}, "rollout.strategy", "blue_green"),
        ({"hold_seconds": 90_000}, "rollout.hold_seconds", "86400"),
        ({"gates": {"max_p99_ttft_ratio": 0.5}}, "rollout.gates.max_p99_ttft_ratio", "1"),
        ({"gates": {"min_requests": True}}, "rollout.gates.min_requests", "number"),
    ],
)
def test_a_bad_rollout_spec_is_a_422_naming_the_field(admin, rollout, field, says):
    b.seed(admin)
    response = admin.post("deployments", b.deployment("bad", rollout=rollout))
    assert response.status_code == 422, response.text
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert field in errors, errors
    assert says in errors[field]


def test_a_deployment_may_not_be_named_like_a_rollout_lane(admin):
    b.seed(admin)
    response = admin.post("deployments", b.deployment("chat--r2"))
    assert response.status_code == 422
    assert "rollout lane" in response.json()["detail"]


# the start on an update --------------------------------------------------------------------


def test_a_new_revision_under_canary_starts_a_rollout_from_the_stable_one(world):
    assert world.get("deployments/chat/rollout").status_code == 404
    _new_revision(world)

    rollout = world.get("deployments/chat/rollout").json()
    assert (rollout["from_revision"], rollout["to_revision"]) == (1, 2)
    assert (rollout["phase"], rollout["step"], rollout["share"]) == ("scaling", 0, 0.0)
    assert rollout["lane"] == "chat--r2" and rollout["steps"] == [0.25, 1.0]
    events = world.get("events", type="RolloutStarted").json()["items"]
    assert [e["object_name"] for e in events] == ["chat"]


def test_a_change_that_keeps_the_revision_starts_nothing(world):
    world.patch("deployments/chat", {"priority": 500})
    assert world.get("deployments/chat/rollout").status_code == 404


def test_immediate_or_unplaced_deployments_roll_out_as_before(world, session_factory):
    world.patch("deployments/chat", {"rollout": {"strategy": "immediate"}})
    _new_revision(world)
    assert world.get("deployments/chat/rollout").status_code == 404

    world.post("deployments", b.deployment("idle", rollout=CANARY))
    world.patch("deployments/idle", {"engine_image": "vllm/vllm-openai:v0.33.0"})
    assert world.get("deployments/idle/rollout").status_code == 404  # placed nowhere


def test_a_change_during_a_rollout_supersedes_it_from_the_same_stable_revision(
    world, session_factory
):
    _new_revision(world)
    _new_revision(world, "vllm/vllm-openai:v0.34.0")

    rollout = world.get("deployments/chat/rollout").json()
    assert (rollout["from_revision"], rollout["to_revision"]) == (1, 3)
    superseded = world.get("events", type="RolloutSuperseded").json()["items"]
    assert len(superseded) == 1 and "superseded by revision 3" in superseded[0]["message"]
    a = _entries(session_factory, "a")
    assert set(a) == {"chat", "chat--r3"} and a["chat"].spec.revision == "1"
    with session_factory() as s:
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "a")).one()
        assert "chat--r2" in desired_state(s, cluster).retired  # the old lane drains


def test_a_revision_number_is_never_taken_again_after_a_rollback(world):
    _new_revision(world)
    rolled = world.post("deployments/chat/rollout/rollback", {})
    assert rolled.status_code == 200, rolled.text
    back = world.get("deployments/chat").json()
    assert back["status"]["revision"] == 1
    assert back["engine_image"] == "vllm/vllm-openai:v0.32.0"  # the stable revision's

    again = _new_revision(world, "vllm/vllm-openai:v0.35.0")
    assert again["status"]["revision"] == 3
    revisions = world.get("deployments/chat/revisions").json()["items"]
    assert [r["revision"] for r in revisions] == [1, 2, 3]
    assert world.get("deployments/chat/rollout").json()["from_revision"] == 1


# the commands -------------------------------------------------------------------------------


def test_the_commands_move_the_rollout_audited_with_an_event_and_a_new_snapshot(
    world, operator, admin, session_factory
):
    _new_revision(world)
    before = _generations(session_factory)

    paused = operator.post("deployments/chat/rollout/pause", {})
    assert paused.status_code == 200, paused.text
    assert (paused.json()["phase"], paused.json()["paused_from"]) == ("paused", "scaling")
    assert operator.post("deployments/chat/rollout/pause", {}).status_code == 409
    after_pause = _generations(session_factory)
    assert all(after_pause[c] > before[c] for c in PLACED)

    resumed = operator.post("deployments/chat/rollout/resume", {}).json()
    assert (resumed["phase"], resumed["paused_from"]) == ("scaling", None)
    assert operator.post("deployments/chat/rollout/resume", {}).status_code == 409

    promoted = operator.post("deployments/chat/rollout/promote", {}).json()
    assert (promoted["phase"], promoted["share"]) == ("promoted", 1.0)
    assert promoted["finished_at"] is not None
    done = operator.post("deployments/chat/rollout/rollback", {})
    assert done.status_code == 409 and "is done (promoted)" in done.json()["detail"]
    assert done.headers["content-type"] == "application/problem+json"

    audit = admin.get("audit", resource_kind="Rollout").json()["items"]
    assert [a["action"] for a in audit] == ["promote", "resume", "pause"]
    assert audit[-1]["actor"] == "token:operator-token"
    assert audit[-1]["before"]["phase"] == "scaling" and audit[-1]["after"]["phase"] == "paused"
    types = [e["type"] for e in world.get("events", object_name="chat").json()["items"]]
    assert types[:3] == ["RolloutPromoted", "RolloutResumed", "RolloutPaused"]
    assert world.get("deployments/chat").json()["status"]["revision"] == 2  # kept


def test_commands_without_a_rollout_are_404_and_a_viewer_may_only_look(world, viewer):
    missing = world.post("deployments/chat/rollout/pause", {})
    assert missing.status_code == 404 and "no rollout" in missing.json()["detail"]
    assert world.post("deployments/nope/rollout/pause", {}).status_code == 404
    assert world.post("deployments/chat/rollout/restart", {}).status_code == 422
    _new_revision(world)
    assert viewer.get("deployments/chat/rollout").status_code == 200
    assert viewer.post("deployments/chat/rollout/promote", {}).status_code == 403


# what the planes are given and what they report ---------------------------------------------


def _counters(requests: int, errors: int = 0) -> OutcomeCounters:
    fast = [0, 0, 0, requests] + [0] * 9  # every request within 0.25 s
    return OutcomeCounters(
        since="r1", requests=requests, errors=errors, ttft_buckets=fast, e2e_buckets=fast
    )


def _heartbeat(
    factory: sessionmaker[Session],
    cluster: str,
    stable: int,
    lane: int,
    lane_errors: int = 0,
    lane_ready: int = 1,
) -> list[str]:
    """Cluster ``cluster`` reports a ready stable replica and ``lane_ready`` ready lane
    replicas, and its router's counters for both entries."""
    report = ObservedState(
        cluster=cluster,
        source=f"cluster/{cluster}",
        replicas=[
            ReplicaStatus(
                replica_id=f"{cluster}-s", deployment="chat", revision="1", state="ready"
            ),
            *(
                ReplicaStatus(
                    replica_id=f"{cluster}-l{i or ''}",
                    deployment="chat--r2",
                    revision="2",
                    state="ready",
                )
                for i in range(lane_ready)
            ),
        ],
        free_capacity=[
            FreeCapacity(gpu_type="H100-80G", pool="p1", gpus=0, waiting_replicas={"chat--r2": 1})
        ],
        deployments=[
            DeploymentObserved(name="chat", demand=2, outcomes=_counters(stable)),
            DeploymentObserved(
                name="chat--r2",
                demand=7,
                outcomes=_counters(lane, lane_errors),
                usage=TokenCounters(since="r1", input_tokens=7, output_tokens=9),
            ),
        ],
    )
    return DbSink(factory)._observed(cluster, report, datetime.now(UTC))[1]


def _tick(factory: sessionmaker[Session]) -> list[str]:
    with factory() as s, s.begin():
        return list(rollouts.tick(s, datetime.now(UTC)))


def test_a_canary_runs_as_a_lane_beside_the_stable_revision_on_each_plane(world, session_factory):
    _new_revision(world)
    a = _entries(session_factory, "a")
    assert set(a) == {"chat", "chat--r2"}
    assert (a["chat"].spec.revision, a["chat"].spec.engine_image) == (
        "1",
        "vllm/vllm-openai:v0.32.0",
    )
    assert a["chat"].quota.max == 3  # no traffic on the lane yet: the stable keeps all
    lane = a["chat--r2"]
    assert (lane.spec.revision, lane.spec.engine_image) == ("2", "vllm/vllm-openai:v0.33.0")
    assert (lane.serves, lane.traffic_share, lane.quota.min, lane.quota.max) == ("chat", 0.0, 1, 1)
    assert _entries(session_factory, "b")["chat--r2"].quota.max == 1


def test_lane_reports_count_for_their_deployment_and_the_tick_walks_the_steps(
    world, session_factory
):
    _new_revision(world)
    assert _heartbeat(session_factory, "a", stable=1000, lane=0) == []  # nothing rejected
    with session_factory() as s:
        replicas = s.execute(select(m.Replica.name, m.Replica.revision, m.Deployment.name).join(
            m.Deployment, m.Deployment.id == m.Replica.deployment_id)).all()  # fmt: skip
        assert sorted(replicas) == [("a-l", 2, "chat"), ("a-s", 1, "chat")]
        assert s.scalars(select(m.TokenUsage.deployment)).all() == ["chat"]
        assert len(s.scalars(select(m.RouterOutcomes)).all()) == 2
        chat = s.scalars(select(m.Deployment)).one()
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "a")).one()
        assert chat.demand_replicas == 2  # the lane's size is the rollout's, not its load's
        assert cluster_status(cluster).demand == {"chat": 2}
        assert cluster_status(cluster).capacity["p1"].waiting_replicas == {"chat": 1}

    before = _generations(session_factory)
    assert _tick(session_factory) == ["chat"]  # 1 lane replica ready of the 1 the step needs
    holding = world.get("deployments/chat/rollout").json()
    assert (holding["phase"], holding["share"]) == ("holding", 0.25)
    assert all(_generations(session_factory)[c] > before[c] for c in PLACED)
    assert _entries(session_factory, "a")["chat--r2"].traffic_share == 0.25

    _heartbeat(session_factory, "a", stable=1400, lane=150)  # 400 and 150 in the window
    assert _tick(session_factory) == ["chat"]
    scaling = world.get("deployments/chat/rollout").json()
    assert (scaling["phase"], scaling["step"], scaling["share"]) == ("scaling", 1, 0.25)
    assert scaling["windows"]["stable"]["requests"] == 400
    assert scaling["windows"]["new"]["requests"] == 150
    a = _entries(session_factory, "a")
    assert a["chat--r2"].quota.max == 3 and a["chat"].quota.max == 3  # pre-scaled for 100 %
    assert _tick(session_factory) == []  # 1 ready of the 4 the last step needs
    assert "waiting for 4 ready replicas" in world.get("deployments/chat/rollout").json()["reason"]

    world.post("deployments/chat/rollout/promote", {})
    a = _entries(session_factory, "a")
    assert list(a) == ["chat"] and a["chat"].spec.revision == "2"
    with session_factory() as s:
        cluster = s.scalars(select(m.Cluster).where(m.Cluster.name == "a")).one()
        assert "chat--r2" in desired_state(s, cluster).retired


@pytest.mark.parametrize(("lane_errors", "phase", "says"), [
    (0, "promoted", "the last step passed its gates"),
    (50, "rolled_back", "gate failed: error rate 20.0%"),
])  # fmt: skip
def test_the_100_percent_step_is_judged_against_what_the_stable_revision_served_before_it(
    world, session_factory, lane_errors, phase, says
):
    """At 100 % the stable revision serves nothing, so its window there is empty: the gates
    compare the new revision with the stable one's window up to the switch, instead of
    waiting for ever for stable requests."""
    _new_revision(world)
    _heartbeat(session_factory, "a", stable=1000, lane=0)
    assert _tick(session_factory) == ["chat"]  # holding at 25 %
    _heartbeat(session_factory, "a", stable=1400, lane=150)
    assert _tick(session_factory) == ["chat"]  # 25 % passed: scaling for 100 %
    _heartbeat(session_factory, "a", stable=1450, lane=150, lane_ready=4)
    assert _tick(session_factory) == ["chat"]
    holding = world.get("deployments/chat/rollout").json()
    assert (holding["phase"], holding["share"]) == ("holding", 1.0)
    assert holding["windows"]["before_switch"]["requests"] == 450  # since the 25 % hold
    # all the traffic on the lane now: 250 answers there, none on the stable entry
    _heartbeat(session_factory, "a", stable=1450, lane=400, lane_errors=lane_errors, lane_ready=4)
    assert _tick(session_factory) == ["chat"]
    done = world.get("deployments/chat/rollout").json()
    assert done["phase"] == phase and says in done["reason"], done
    assert done["windows"]["stable"]["requests"] == 0 and done["windows"]["new"]["requests"] == 250


def test_a_failed_gate_rolls_back_to_the_stable_revision_everywhere(world, session_factory):
    _new_revision(world)
    _heartbeat(session_factory, "a", stable=1000, lane=0)
    _tick(session_factory)  # holding at 25 %
    _heartbeat(session_factory, "a", stable=1400, lane=150, lane_errors=60)
    replans: list[str] = []
    app = Celery("test-worker", set_as_current=False)
    deps = Deps(factory=session_factory, providers=lambda row: None, replan=replans.append)  # type: ignore[arg-type]
    register(app, lambda: Worker(Settings(), deps))
    assert app.tasks[ROLLOUTS].run() == {"chat": "rolled_back"}  # the beat's task
    assert replans == ["rolled back: chat"]  # the stable spec may be placed differently

    rollout = world.get("deployments/chat/rollout").json()
    assert rollout["phase"] == "rolled_back" and rollout["reason"].startswith("gate failed")
    chat = world.get("deployments/chat").json()
    assert (chat["status"]["revision"], chat["engine_image"]) == (1, "vllm/vllm-openai:v0.32.0")
    a = _entries(session_factory, "a")
    assert list(a) == ["chat"] and a["chat"].spec.revision == "1"
    events = world.get("events", type="RolloutRolledBack").json()["items"]
    assert len(events) == 1 and "error rate" in events[0]["message"]


def test_the_tick_skips_a_deployment_a_write_holds_instead_of_waiting(world, session_factory):
    _new_revision(world)
    _heartbeat(session_factory, "a", stable=1000, lane=0)  # the step's replica is ready
    with session_factory() as writer, writer.begin():
        writer.scalars(
            select(m.Deployment).where(m.Deployment.name == "chat").with_for_update()
        ).one()
        assert _tick(session_factory) == []  # not blocked, not moved
    assert _tick(session_factory) == ["chat"]


def test_the_dashboards_deployment_page_shows_the_rollout(world, app_client, tokens):
    from controlplane.dashboard.session import COOKIE

    login = app_client.post("/login", data={"token": tokens["viewer"]}, follow_redirects=False)
    assert login.status_code == 303 and COOKIE in login.cookies
    before = app_client.get("/deployments/chat")
    assert (
        before.status_code == 200
        and "the next change of a revision field starts a canary" in before.text
    )
    _new_revision(world)
    page = app_client.get("/deployments/chat")
    assert page.status_code == 200
    assert "Revision 1 → 2 (canary)" in page.text and "<strong>scaling</strong>" in page.text
    assert "25 % → 100 %" in page.text


def test_an_idle_step_passes_when_its_hold_is_over_and_the_event_says_so(world, session_factory):
    _new_revision(world)
    _heartbeat(session_factory, "a", stable=0, lane=0)  # the step's replica is ready
    assert _tick(session_factory) == ["chat"]  # holding at 25 %
    _heartbeat(session_factory, "a", stable=30, lane=10)  # 40 requests: under the 100
    assert _tick(session_factory) == ["chat"]
    rollout = world.get("deployments/chat/rollout").json()
    assert (rollout["phase"], rollout["step"]) == ("scaling", 1)
    assert rollout["reason"] == "25% passed (idle: 40 requests in the window, nothing to judge)"
    events = world.get("events", type="RolloutScaling").json()["items"]
    assert "idle: 40 requests" in events[0]["message"]


def test_nothing_moves_while_the_bus_process_is_behind_the_reports(world, session_factory):
    """Frozen or dead, the bus process reads no outcome counters: a window with too few
    requests passes its gates, and a failing revision was promoted while its errors sat
    unread in the stream. The rollouts wait until it has caught up."""
    from controlplane.services.clusters import record_bus_progress

    _new_revision(world)
    _heartbeat(session_factory, "a", stable=0, lane=0)
    assert _tick(session_factory) == ["chat"]  # holding at 25 %
    _heartbeat(session_factory, "a", stable=30, lane=10)
    stalled = datetime.now(UTC) - timedelta(seconds=60)
    with session_factory() as s, s.begin():
        record_bus_progress(s, "gpufleet-controlplane", stalled, stalled, 9, 5, 4)
    assert _tick(session_factory) == []  # held: the gates would read a blind window
    assert world.get("deployments/chat/rollout").json()["step"] == 0
    now = datetime.now(UTC)
    with session_factory() as s, s.begin():
        record_bus_progress(s, "gpufleet-controlplane", now, now, 9, 9, 0)
    assert _tick(session_factory) == ["chat"]  # caught up: on it goes
