"""Issue 12 items 10 and 2 on the plane: a newer epoch takes a plane back from a generation
the control plane never issued; a deployment a snapshot drops while it has traffic here
keeps serving through a grace period, unless the snapshot retires it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.contracts import DeploymentKept, DesiredState, DesiredStateApplied, Envelope
from tests.unit.workloadplane.builders import (
    RecordingRuntime,
    make_deployment,
    make_desired,
    make_replica,
)
from workloadplane.agent import Agent
from workloadplane.reconcile import Kept, keep_dropped, reconcile, with_kept
from workloadplane.state import DesiredStateStore, should_apply

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GRACE = timedelta(seconds=120)


def at(generation: int, epoch: int, *deployments, retired: list[str] | None = None):
    return make_desired(generation, *deployments).model_copy(
        update={"epoch": epoch, "retired": retired or []}
    )


# --- epochs -------------------------------------------------------------------------------


def test_a_newer_epoch_wins_whatever_its_generation_and_within_one_the_higher_generation():
    forged = at(10**12, 0)
    assert should_apply(None, forged, "a")
    assert not should_apply(forged, at(7, 0), "a"), "same epoch: the forged generation holds"
    assert should_apply(forged, at(7, 1), "a"), "a newer epoch takes the plane back"
    assert not should_apply(at(7, 1), at(10**12, 0), "a"), "the old epoch never comes back"
    assert should_apply(at(7, 1), at(8, 1), "a")
    assert not should_apply(at(8, 1), at(8, 1), "a")


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 10**12)), min_size=1, max_size=20))
def test_the_agent_ends_on_the_newest_version_whatever_the_order(versions):
    held: DesiredState | None = None
    for epoch, generation in versions:
        incoming = at(generation, epoch)
        if should_apply(held, incoming, "a"):
            held = incoming
    assert held is not None and held.version == max(versions)


def test_the_store_loads_the_newest_epoch_not_the_highest_generation(tmp_path: Path):
    store = DesiredStateStore(tmp_path, fsync=False)
    store.save(at(10**12, 0, make_deployment("old")))
    store.save(at(3, 1, make_deployment("new")))
    loaded = DesiredStateStore(tmp_path).load()
    assert loaded is not None and loaded.version == (1, 3)


# --- the disappearance grace (pure) -------------------------------------------------------

CHAT, OTHER = make_deployment("chat"), make_deployment("other")


def test_a_dropped_deployment_with_recent_traffic_is_kept_for_the_grace_period():
    kept = keep_dropped([CHAT, OTHER], {}, at(2, 0, OTHER), {"chat": NOW - timedelta(seconds=5)},
                        NOW, GRACE)  # fmt: skip
    assert kept == {"chat": Kept(CHAT, NOW + GRACE)}
    # later passes keep it until then (the grace does not restart), then let it go
    later = NOW + GRACE - timedelta(seconds=1)
    assert keep_dropped([CHAT, OTHER], kept, at(2, 0, OTHER), {"chat": later}, later, GRACE) == kept
    assert keep_dropped([CHAT, OTHER], kept, at(2, 0, OTHER), {"chat": later}, NOW + GRACE,
                        GRACE) == {}  # fmt: skip


def test_retired_idle_or_placed_again_is_not_kept():
    busy = {"chat": NOW}
    assert keep_dropped([CHAT], {}, at(2, 0, retired=["chat"]), busy, NOW, GRACE) == {}
    idle = {"chat": NOW - timedelta(seconds=CHAT.autoscaling.window_seconds + 1)}
    assert keep_dropped([CHAT], {}, at(2, 0), idle, NOW, GRACE) == {}
    assert keep_dropped([CHAT], {}, at(2, 0), {}, NOW, GRACE) == {}
    kept = {"chat": Kept(CHAT, NOW + GRACE)}
    assert keep_dropped([CHAT], kept, at(3, 0, CHAT), busy, NOW, GRACE) == {}
    assert keep_dropped([CHAT], kept, at(3, 0, retired=["chat"]), busy, NOW, GRACE) == {}


def test_a_deleted_deployments_rollout_lane_goes_with_it():
    """A deployment deleted during a rollout is in `retired`; its lane (which serves it) is
    not listed by its own name anywhere, and must not outlive it by the grace period."""
    lane = make_deployment("chat--r2").model_copy(update={"serves": "chat", "traffic_share": 0.2})
    busy = {"chat": NOW, "chat--r2": NOW}
    assert keep_dropped([CHAT, lane], {}, at(2, 0, retired=["chat"]), busy, NOW, GRACE) == {}
    # dropped without `retired` (the control plane's blind spot), both stay for the grace
    assert set(keep_dropped([CHAT, lane], {}, at(2, 0), busy, NOW, GRACE)) == {"chat", "chat--r2"}


def test_reconcile_drains_nothing_of_a_kept_deployment_and_everything_of_a_retired_one():
    replicas = [make_replica("chat-1"), make_replica("chat-2")]
    dropped = at(2, 0)
    kept = keep_dropped([CHAT], {}, dropped, {"chat": NOW}, NOW, GRACE)
    wanted = {"chat": 2}  # the local autoscaler still sizes a kept deployment
    assert reconcile(with_kept(dropped, kept), replicas, wanted, now=NOW) == []
    retired = at(2, 0, retired=["chat"])
    kept = keep_dropped([CHAT], {}, retired, {"chat": NOW}, NOW, GRACE)
    actions = reconcile(with_kept(retired, kept), replicas, wanted, now=NOW)
    assert sorted(a.replica_id for a in actions) == ["chat-1", "chat-2"]  # type: ignore[union-attr]


@given(
    traffic_ago=st.one_of(st.none(), st.floats(0, 600)),
    retired=st.booleans(),
    passes=st.lists(st.floats(0, 300), min_size=1, max_size=8),
)
def test_a_dropped_deployment_is_never_kept_past_the_grace_nor_when_retired(
    traffic_ago, retired, passes
):
    desired = at(2, 0, OTHER, retired=["chat"] if retired else [])
    last = {} if traffic_ago is None else {"chat": NOW - timedelta(seconds=traffic_ago)}
    served, kept, now = [CHAT, OTHER], {}, NOW
    for step in passes:
        kept = keep_dropped(served, kept, desired, last, now, GRACE)
        served = with_kept(desired, kept).deployments
        if "chat" in kept:
            assert not retired
            assert now < kept["chat"].until <= NOW + GRACE
        elif now == NOW:
            assert retired or traffic_ago is None or traffic_ago > CHAT.autoscaling.window_seconds
        now += timedelta(seconds=step)
    assert {d.name for d in served} >= {"other"}


# --- the agent ----------------------------------------------------------------------------


class FactsBus:
    def __init__(self) -> None:
        self.facts: list[Envelope] = []

    def publish_fact(self, fact: Envelope) -> None:
        self.facts.append(fact)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class BusyRouter:
    """Router double: the load the agent samples for traffic, and what it is told to serve."""

    def __init__(self, busy: set[str]) -> None:
        self.busy, self.served, self.config = busy, [], None

    def load(self, name: str) -> tuple[int, int]:
        return (1, 0) if name in self.busy else (0, 0)

    def set_deployments(self, deployments) -> None:
        self.served = [d.name for d in deployments]

    def set_replicas(self, replicas) -> None:
        pass


@pytest.mark.asyncio(loop_scope="session")
async def test_the_agent_keeps_a_busy_dropped_deployment_serving_reports_it_then_lets_go(
    tmp_path: Path,
):
    runtime, clock, router = RecordingRuntime(), Clock(), BusyRouter({"chat"})
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), clock=clock)
    agent.router = router  # type: ignore[assignment]  # (only its load is read here)
    bus = FactsBus()
    agent.bus = bus  # type: ignore[assignment]
    await agent.on_desired(at(1, 0, make_deployment("chat", min_=2)))
    await agent.reconcile_once()
    runtime.make_ready()
    await agent.on_desired(at(2, 0))
    await agent.reconcile_once()
    assert router.served == ["chat"]
    assert not [c for c in runtime.calls if c[0] in ("stop", "drain")]
    kept = [f for f in bus.facts if isinstance(f, DeploymentKept)]
    assert [(f.deployment, f.until) for f in kept] == [("chat", NOW + agent.disappearance_grace)]
    clock.now = NOW + agent.disappearance_grace
    await agent.reconcile_once()
    assert router.served == []
    assert sorted(c[0] for c in runtime.calls if c[0] in ("stop", "drain")) == ["drain", "drain"]


@pytest.mark.asyncio(loop_scope="session")
async def test_the_router_in_its_own_process_serves_a_kept_deployment_too(tmp_path: Path):
    """The agent kept the deployment for its in-process router only: the router process
    (``gpufleet up`` runs one) read the snapshot, failed the queued requests and answered
    404 model_not_found for the whole grace period."""
    from workloadplane.router.core import Router
    from workloadplane.router.follower import PlaneFollower

    runtime, clock, router = RecordingRuntime(), Clock(), BusyRouter({"chat"})
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), clock=clock)
    agent.router = router  # type: ignore[assignment]  # (only its load is read here)
    agent.bus = FactsBus()  # type: ignore[assignment]
    process = Router()
    follower = PlaneFollower(process, tmp_path)
    await agent.on_desired(at(1, 0, make_deployment("chat", min_=2)))
    await agent.reconcile_once()
    runtime.make_ready()
    await agent.on_desired(at(2, 0, make_deployment("code")))
    await agent.reconcile_once()
    follower.poll()
    assert follower.version == (0, 2)
    assert {m for m, _ in process.model_ids()} == {"chat", "code"}
    clock.now = NOW + agent.disappearance_grace
    await agent.reconcile_once()
    follower.poll()
    follower.poll()  # (a change is read twice, one poll apart)
    assert {m for m, _ in process.model_ids()} == {"code"}


@pytest.mark.asyncio(loop_scope="session")
async def test_the_agent_acknowledges_the_new_epoch_with_a_lower_generation(tmp_path: Path):
    runtime = RecordingRuntime()
    agent = Agent("a", runtime, DesiredStateStore(tmp_path, fsync=False), clock=lambda: NOW)
    bus = FactsBus()
    agent.bus = bus  # type: ignore[assignment]
    await agent.on_desired(at(10**12, 0, make_deployment(min_=1)))
    await agent.reconcile_once()
    await agent.on_desired(at(7, 1, make_deployment(min_=2)))
    await agent.reconcile_once()
    acks = [(f.epoch, f.generation) for f in bus.facts if isinstance(f, DesiredStateApplied)]
    assert acks == [(0, 10**12), (1, 7)]
    assert len(runtime.replicas) == 2
    observed = await agent.observed_state()
    assert (observed.observed_epoch, observed.observed_generation) == (1, 7)
