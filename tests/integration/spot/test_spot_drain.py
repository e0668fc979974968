"""A spot interruption under steady load loses no request.

Both planes real (PostgreSQL, NATS with per-cluster users, two agents with ProcessRuntime
running engine-sim replicas behind their routers, the local provider); see `drill.py` for
the set-up. Story: `spot-a` serves a closed loop of clients from two replicas on two spot
instances; the provider gives one instance two minutes' notice (here 8 s); `spot-a`'s agent
reports it → the control plane marks the instance draining and re-plans at once → one
replica moves to `od-b`'s on-demand pool and its instance is bought → the desired states
reach both agents → `spot-a` drains one replica (the router stops sending to it, its
requests finish, then it stops) while `od-b` starts the replacement → at the deadline the
interrupted instance is released. No client sees an error at any point.

Waits are bounded; the replicas run on the real clock, so the drill does too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import models as m
from tests.integration.spot.drill import (
    CLUSTER_OD,
    CLUSTER_SPOT,
    DRAIN_LEAD_S,
    ON_DEMAND,
    SPOT,
    DrillResult,
    instances,
    run_drill,
    truncate,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

NOTICE_S = 8.0


@pytest.fixture
def empty(engine: Engine) -> Iterator[None]:
    truncate(engine)
    yield
    truncate(engine)


def report(r: DrillResult) -> str:
    return (
        f"spot drill ({'one cluster' if r.one_cluster else 'two clusters'}): decided "
        f"{r.decided_s * 1000:.0f} ms, procured {r.procured_s:.2f} s, drain began "
        f"{r.drain_started_s:.2f} s ({r.in_flight_at_drain} in flight), drained "
        f"{r.drained_s:.2f} s, replacement ready {r.replacement_ready_s:.2f} s, released "
        f"{r.released_s:.2f} s (deadline {NOTICE_S:g} s); requests {r.requests}, failed "
        f"{r.failed}; re-plans {r.replans}"
    )


def assert_common(r: DrillResult, factory: sessionmaker[Session]) -> None:
    assert r.failed == 0, r.spot.failures + r.replacement.failures
    assert r.decided_s <= 1.0, f"replacement decided {r.decided_s:.3f} s after the notice"
    assert r.decided_s <= r.procured_s < NOTICE_S
    # the replica on the interrupted instance is the one drained, gracefully (it was serving)
    assert r.drained_replica_instance == r.victim
    assert r.in_flight_at_drain >= 1
    assert r.drain_started_s < r.drained_s < NOTICE_S, "drained before the deadline"
    assert r.lost_at_deadline == [], "replicas still on the instance when it was taken back"
    assert r.replacement_ready_s < NOTICE_S
    # make before break when the notice allows it: the drain waits for a ready replacement
    # (in this cluster, or in another one while the control plane holds the replica), but
    # never past the drain lead before the deadline (a slow start must not cost requests)
    drain_by = NOTICE_S - DRAIN_LEAD_S
    assert r.drain_started_s < drain_by + 0.5, "drained within the lead before the deadline"
    if not r.replacement_ready_at_drain:
        assert r.drain_started_s >= drain_by - 0.1, (
            f"drained at {r.drain_started_s:.2f} s without a ready replacement, before the "
            f"lead ({drain_by:g} s)"
        )
    assert NOTICE_S <= r.released_s < math.inf, "the interrupted instance is given back"
    assert sorted(instances(factory, SPOT).values()) == ["released", "running"]
    assert list(instances(factory, ON_DEMAND).values()) == ["running"]
    with factory() as s:
        kinds = set(s.scalars(select(m.Event.type)))
    assert {"SpotInterruptionNoticed", "InstanceDraining", "InstanceAcquired",
            "InstanceReleased", "PlacementChanged"} <= kinds  # fmt: skip


def placed(factory: sessionmaker[Session]) -> dict[tuple[str, str], int]:
    with factory() as s:
        return {
            (c, p): n
            for c, p, n in s.execute(
                select(m.Cluster.name, m.Pool.name, m.Placement.replicas)
                .join(m.Cluster, m.Cluster.id == m.Placement.cluster_id)
                .join(m.Pool, m.Pool.id == m.Placement.pool_id)
            )
        }


async def test_spot_notice_inside_one_cluster_moves_the_replica_on_that_instance(
    empty, session_factory: sessionmaker[Session], database_url: str, tmp_path: Path
):
    """The plane runs on both pools: the replica on the interrupted instance moves to the
    on-demand pool of the same cluster, its replacement ready before it drains."""
    r = await run_drill(session_factory, database_url, tmp_path, notice_s=NOTICE_S,
                        one_cluster=True)  # fmt: skip
    print(report(r))
    assert_common(r, session_factory)
    assert r.spot.ok >= 20, r.spot.ok
    assert r.final == {CLUSTER_SPOT: ["ready", "ready"]}
    assert placed(session_factory) == {(CLUSTER_SPOT, SPOT): 1, (CLUSTER_SPOT, ON_DEMAND): 1}


async def test_spot_notice_replaces_and_drains_with_zero_failed_requests(
    empty, session_factory: sessionmaker[Session], database_url: str, tmp_path: Path
):
    r = await run_drill(session_factory, database_url, tmp_path, notice_s=NOTICE_S)
    print(report(r))
    assert_common(r, session_factory)
    assert r.spot.ok >= 20 and r.replacement.ok >= 1, (r.spot.ok, r.replacement.ok)
    assert r.final == {CLUSTER_SPOT: ["ready"], CLUSTER_OD: ["ready"]}
    assert placed(session_factory) == {(CLUSTER_SPOT, SPOT): 1, (CLUSTER_OD, ON_DEMAND): 1}
