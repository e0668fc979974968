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
    ON_DEMAND,
    SPOT,
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


async def test_spot_notice_replaces_and_drains_with_zero_failed_requests(
    empty, session_factory: sessionmaker[Session], database_url: str, tmp_path: Path
):
    r = await run_drill(session_factory, database_url, tmp_path, notice_s=NOTICE_S)
    print(
        f"spot drill: decided {r.decided_s * 1000:.0f} ms, procured {r.procured_s:.2f} s, "
        f"drain began {r.drain_started_s:.2f} s ({r.in_flight_at_drain} in flight), "
        f"drained {r.drained_s:.2f} s, replacement ready {r.replacement_ready_s:.2f} s, "
        f"released {r.released_s:.2f} s (deadline {NOTICE_S:g} s); requests {r.requests}, "
        f"failed {r.failed}; re-plans {r.replans}"
    )
    assert r.failed == 0, r.spot.failures + r.replacement.failures
    assert r.spot.ok >= 20 and r.replacement.ok >= 1, (r.spot.ok, r.replacement.ok)

    assert r.decided_s <= 1.0, f"replacement decided {r.decided_s:.3f} s after the notice"
    assert r.decided_s <= r.procured_s < NOTICE_S
    # the drained replica was serving: a graceful drain, not an idle stop
    assert r.in_flight_at_drain >= 1
    assert r.drain_started_s < r.drained_s < NOTICE_S, "drained before the deadline"
    assert r.lost_at_deadline == [], "replicas still on the instance when it was taken back"
    assert r.replacement_ready_s < NOTICE_S
    assert NOTICE_S <= r.released_s < math.inf, "the interrupted instance is given back"

    assert r.final == {CLUSTER_SPOT: ["ready"], CLUSTER_OD: ["ready"]}
    assert sorted(instances(session_factory, SPOT).values()) == ["released", "running"]
    assert list(instances(session_factory, ON_DEMAND).values()) == ["running"]
    with session_factory() as s:
        placed = {
            (c, p): n
            for c, p, n in s.execute(
                select(m.Cluster.name, m.Pool.name, m.Placement.replicas)
                .join(m.Cluster, m.Cluster.id == m.Placement.cluster_id)
                .join(m.Pool, m.Pool.id == m.Placement.pool_id)
            )
        }
        kinds = set(s.scalars(select(m.Event.type)))
    assert placed == {(CLUSTER_SPOT, SPOT): 1, (CLUSTER_OD, ON_DEMAND): 1}
    assert {"SpotInterruptionNoticed", "InstanceDraining", "InstanceAcquired",
            "InstanceReleased", "PlacementChanged"} <= kinds  # fmt: skip
