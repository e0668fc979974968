"""Both planes on real PostgreSQL and NATS: a placement reaches a cluster's agent, the agent's
reports land in the database, and silence marks the cluster stale, then down.

The control plane's bus side (`run_bus`) and an agent (memory runtime) run in this process;
NATS runs with the authorization config that `gpufleet up` uses (per-cluster users).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update

from controlplane.db import models as m
from controlplane.services.clusters import record_bus_progress, update_liveness
from controlplane.services.placement import replan
from tests.integration.api import builders as b
from tests.integration.bus.conftest import eventually
from tests.integration.planes.conftest import bus_and_agent


async def test_desired_state_flows_down_and_reports_flow_up(
    fleet, session_factory, database_url, tmp_path: Path, monkeypatch
):
    async with bus_and_agent(fleet, session_factory, database_url, tmp_path, monkeypatch):
        await eventually(
            lambda: _cluster(session_factory).state == "healthy", 15, "first heartbeat"
        )
        with session_factory() as s, s.begin():
            assert replan(s, "test") is not None
        generation = _cluster(session_factory).desired_generation
        assert generation >= 1

        await eventually(lambda: _cluster(session_factory).observed_generation >= generation, 15,
                         "the agent to apply the placement")  # fmt: skip
        await eventually(lambda: len(_replicas(session_factory)) == 2, 15, "two replicas reported")
        with session_factory() as s:
            facts = {
                e.type for e in s.scalars(select(m.Event).where(m.Event.object_name == "use1-a"))
            }
        assert "DesiredStateApplied" in facts
        assert {r.state for r in _replicas(session_factory)} == {"ready"}

    last = _cluster(session_factory).last_heartbeat_at
    assert last is not None
    for seconds, expected in ((5, "healthy"), (20, "stale"), (90, "down")):
        with session_factory() as s, s.begin():  # the bus kept up all along (see test_bus_trust)
            at = last + timedelta(seconds=seconds)
            record_bus_progress(s, "gpufleet-controlplane", at, at, 0, 0, 0)
        with session_factory() as s, s.begin():
            update_liveness(
                s, last + timedelta(seconds=seconds), timedelta(seconds=15), timedelta(seconds=60)
            )
        assert _cluster(session_factory).state == expected
    with session_factory() as s:
        kinds = [
            e.type
            for e in s.scalars(
                select(m.Event)
                .where(m.Event.type.in_(["ClusterStale", "ClusterDown"]))
                .order_by(m.Event.time)
            )
        ]
    assert kinds == ["ClusterStale", "ClusterDown"]


def _cluster(factory) -> m.Cluster:
    with factory() as s:
        return s.scalars(select(m.Cluster)).one()


def _replicas(factory) -> list[m.Replica]:
    with factory() as s:
        return list(s.scalars(select(m.Replica)))


def test_silent_pending_clusters_are_not_declared_down(admin, session_factory):
    b.seed(admin)
    with session_factory() as s, s.begin():
        s.execute(update(m.Cluster).values(state="pending"))
        from datetime import UTC, datetime

        assert (
            update_liveness(s, datetime.now(UTC), timedelta(seconds=1), timedelta(seconds=2)) == []
        )
